"""One run of the loop under a strategy, for every client (the UNet experiment and ``tfdist.fit``).

Given the steps, the model's checkpoint, the outputs and the input
functions, ``drive`` makes the rest the same way for both: this task's
heartbeat and progress watchdog (``training.watchdog``), the loop for the
strategy (``training.loop.make_loop``), the ``Controller`` with its schedule,
the switch of preemption signals to "stop at the next chunk", and closing
the checkpoints and outputs however the run ends.
"""

from __future__ import annotations

from tfdist import strategies
from tfdist.cluster.task import Task
from tfdist.errors import PEER_LOST_EXIT_CODE
from tfdist.training.controller import Controller
from tfdist.training.loop import make_loop
from tfdist.training.roles import tell_servers
from tfdist.training.rundir import RunDir
from tfdist.training.watchdog import BatchCounter, Watchdog


def watched_tasks(task: Task | None) -> list[str]:
    """The tasks whose heartbeats a watchdog reads: every task of the training cluster (``["local"]`` without one)."""
    if task is None:
        return ["local"]
    return [f"{t}:{i}" for t, i in task.training_spec.task_list()]


def drive(*, runtime, task: Task | None, run_dir: RunDir, strategy, steps, step_counter, checkpoints, outputs,
          train_dataset_fn, eval_dataset_fn, start_step: int, total_steps: int, preemption=None, **schedule):
    """Train ``steps`` from ``start_step`` to ``total_steps``; returns ``(controller, loop, last eval metrics)``.

    Args:
      runtime: the run's ``RuntimeConfig`` (strategy, ``progress_timeout``).
      task: this task, or None outside a cluster.
      run_dir: the run directory (heartbeats).
      strategy, steps, step_counter: as the loops take them.
      checkpoints: a ``Checkpoints`` (or None), closed at the end.
      outputs: a ``RunOutputs``, closed at the end.
      train_dataset_fn, eval_dataset_fn: ``InputContext -> Dataset`` (``eval_dataset_fn`` None: no eval).
      preemption: this task's ``Preemption``, or None.
      schedule: the rest of ``Controller``'s arguments (steps per epoch, loop, log, checkpoint; ...).
    """
    traits = strategies.traits(runtime.strategy)
    # From here on every task keeps a heartbeat in the run directory.
    batches = None if traits.coordinator else BatchCounter(start_step)
    watchdog = Watchdog(
        task=task.name if task else "local", tasks=watched_tasks(task), directory=run_dir.heartbeats,
        timeout=runtime.progress_timeout, step=start_step, total_steps=total_steps, batches=batches,
        before_exit=(lambda: tell_servers(task, PEER_LOST_EXIT_CODE)) if traits.coordinator else None,
    )
    loop = make_loop(coordinator=traits.coordinator, strategy=strategy, steps=steps, step_counter=step_counter,
                     train_dataset_fn=batches.wrap(train_dataset_fn) if batches else train_dataset_fn,
                     eval_dataset_fn=eval_dataset_fn)
    controller = Controller(loop=loop, checkpoints=checkpoints, outputs=outputs, preemption=preemption,
                            watchdog=watchdog, evaluates=eval_dataset_fn is not None, **schedule)
    if preemption is not None:
        preemption.deferred()  # from here a signal stops the run at the next chunk, with a checkpoint
    try:
        with watchdog:
            final = controller.run(start_step, total_steps)
    finally:
        if checkpoints:
            checkpoints.close()
        outputs.close()
    return controller, loop, final
