"""A task's life in a cluster, for any client: placement, session, serving, peer errors, preemption, watchdog,
and the run of the loop."""
