"""A training task that loses a peer ends with one line, and the tasks of a synchronous cluster finish together."""

from __future__ import annotations

import contextlib
import re
import threading

from tfdist.cluster.network import answers
from tfdist.cluster.task import Task
from tfdist.errors import PeerLost
from tfdist.rundir import RunDir
from tfdist.runtime.placement import Placement
from tfdist.runtime.watchdog import stopped_tasks
from tfdist import _compat

#: TensorFlow error types (by name) that mean a peer of the cluster was lost or stopped answering.
PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError")


def _reason(error: Exception) -> str:
    """The informative line of a TensorFlow error about a lost peer (not "Graph execution error")."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines() if line.strip()]
    for line in lines:
        if "aborted by:" in line:  # "Collective ops is aborted by: <the cause>"
            return line.split("aborted by:", 1)[1].strip() or line
    noise = ("Graph execution error", "Detected at node", "File ", "Additional GRPC error", ":UNKNOWN:")
    useful = [line for line in lines
              if not line.startswith(noise) and not re.fullmatch(r"\d+ root error\(s\) found\.", line)]
    return (useful or lines or [type(error).__name__])[0][:300]


def _silent(task: Task) -> list[str]:
    """The peers of ``task`` whose port does not answer now (one TCP probe each, in parallel): the lost ones."""
    peers = task.peers()
    up: dict[str, bool] = {}
    threads = [threading.Thread(target=lambda p=peer: up.__setitem__(p.name, answers(p.address, timeout=2.0)))
               for peer in peers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5.0)
    return [f"{peer.name} at {peer.address}" for peer in peers if not up.get(peer.name, True)]


@contextlib.contextmanager
def peer_errors(placement: Placement, run_dir: RunDir):
    """Turn TensorFlow's errors about a lost peer into one ``PeerLost`` line (exit status 4).

    Under ``multi_worker_mirrored`` every collective needs every worker: when
    one is lost, TensorFlow's coordination service (heartbeats) or the gRPC
    connection aborts the collectives of the others within seconds, and
    ``--collective_timeout`` bounds a collective that waits on a peer that
    is up but stuck. Under ``parameter_server`` a lost worker is handled by
    the coordinator; a lost ps task ends the run here.
    """
    try:
        yield
    except Exception as e:
        task = placement.task
        if task.spec.num_tasks < 2 or type(e).__name__ not in PEER_ERRORS:
            raise
        import tensorflow as tf

        latest = run_dir.latest_checkpoint()
        silent = _silent(task)
        frozen = stopped_tasks(run_dir.heartbeats, [p.name for p in task.peers()
                                                    if not any(s.startswith(f"{p.name} ") for s in silent)])
        lost = f"{', '.join(silent)} does not answer; " if silent else ""
        lost += f"{', '.join(frozen)}; " if frozen else ""
        timed_out = " and every collective to finish within --collective_timeout" if isinstance(
            e, tf.errors.DeadlineExceededError) else ""
        raise PeerLost(
            f"Lost a task of the {placement.strategy} cluster, or it stopped answering (this is {task.name}): "
            f"{lost}{_reason(e).rstrip('.')}. Received: {type(e).__name__} from TensorFlow. "
            "Expected every task to stay "
            f"up until the end{timed_out}; relaunch the whole cluster (e.g. python -m tfdist.launch "
            f"--max_restarts 1) to resume from the latest checkpoint ({latest or 'none saved yet'})."
        ) from None


def finish_together(placement: Placement, timeout: float) -> None:
    """Strategies that end with a barrier: wait until every worker is done (the leader exports last).

    TensorFlow's coordination service makes every task wait at exit for all
    the others; a worker that leaves first is taken for a crashed one only
    after the heartbeat timeout, seconds lost per run. A barrier at the
    end lets them all leave together. Lost peers surface as TensorFlow errors
    (see ``peer_errors``).
    """
    task = placement.task
    if not placement.traits.ends_with_barrier or task.training_spec.num_tasks < 2:
        return
    _compat.wait_at_barrier("tfdist-finished", int(timeout * 1000))
