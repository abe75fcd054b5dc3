"""What a task of a cluster does besides training: serve a coordinator, report a lost peer, finish together.

``python -m tfdist.train`` runs the same command on every task; the task's
type decides its role (``strategies.Traits.role``):

- ``train``: the chief and workers of a strategy without a coordinator (all
  train, the leader writes the outputs), the chief of one with a coordinator
  (it runs the ``ClusterCoordinator``), or a single process;
- ``serve``: the ``ps`` and ``worker`` tasks under a coordinator. They start a
  ``tf.distribute.Server`` and serve the chief's requests until the chief is
  done (``serve``);
- ``evaluate``: the ``evaluator`` side-car (``training.evaluator``).

TensorFlow gives no "the chief is done" signal to a ps or worker task, and
its gRPC server has no clean stop, so a serving task waits for the chief's
port to answer (at most ``--connect_timeout``) and ends, with status 0, once
it stops answering (``cluster.peers``). A training task that loses a peer
mid-run ends with one line (``peer_errors``) instead of a traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import NoReturn

from tfdist.cluster.peers import POLL_SECONDS, PeerWatch, grpc_bind_errors
from tfdist.cluster.task import Task
from tfdist.errors import PeerLost
from tfdist.strategies import Traits, set_grpc_fail_fast
from tfdist.training.rundir import RunDir

#: TensorFlow error types (by name) that mean a peer of the cluster was lost or stopped answering.
PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError")


def _exit_now(status: int) -> NoReturn:
    """End the process at once, after flushing stdio.

    A serving task ends this way because TensorFlow's gRPC server cannot be
    stopped: destroying it aborts the process ("Clean shutdown is not
    currently implemented").
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _reason(error: Exception) -> str:
    """The informative line of a TensorFlow error about a lost peer (not "Graph execution error")."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines() if line.strip()]
    for line in lines:
        if "aborted by:" in line:  # "Collective ops is aborted by: <the cause>"
            return line.split("aborted by:", 1)[1].strip() or line
    useful = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node", "File "))]
    return (useful or lines or [type(error).__name__])[0][:300]


@contextlib.contextmanager
def peer_errors(task: Task | None, strategy: str, run_dir: RunDir):
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
        if task is None or task.spec.num_tasks < 2 or type(e).__name__ not in PEER_ERRORS:
            raise
        import tensorflow as tf

        latest = run_dir.latest_checkpoint()
        timed_out = " and every collective to finish within --collective_timeout" if isinstance(
            e, tf.errors.DeadlineExceededError) else ""
        raise PeerLost(
            f"Lost a task of the {strategy} cluster, or it stopped answering (this is {task.name}): "
            f"{_reason(e).rstrip('.')}. Received: {type(e).__name__} from TensorFlow. Expected every task to stay "
            f"up until the end{timed_out}; relaunch the whole cluster (e.g. python -m tfdist.launch "
            f"--max_restarts 1) to resume from the latest checkpoint ({latest or 'none saved yet'})."
        ) from None


def finish_together(task: Task | None, traits: Traits, timeout: float) -> None:
    """Strategies that end with a barrier: wait until every worker is done (the leader exports last).

    TensorFlow's coordination service makes every task wait at exit for all
    the others; a worker that leaves first is taken for a crashed one only
    after the heartbeat timeout (7 s lost per run, measured). A barrier at the
    end lets them all leave together. Lost peers surface as TensorFlow errors
    (see ``peer_errors``).
    """
    if not traits.ends_with_barrier or task is None or task.training_spec.num_tasks < 2:
        return
    from tensorflow.python.eager import context  # the coordination service's barrier has no public API

    context.context().wait_at_barrier("tfdist-finished", int(timeout * 1000))


def serve(task: Task, *, connect_timeout: float, verbose: bool = True) -> NoReturn:
    """A ps or worker task of a coordinated strategy: serve the chief until it is done, then end with status 0.

    The chief must answer within ``connect_timeout`` (else a ``UserError``,
    status 2). Once it has been seen, the task ends when the chief's port
    stops answering (``MISSES_FOR_GONE`` probes in a row): the chief is done,
    or lost, and either way nothing is left to serve. The process ends with
    ``os._exit`` because TensorFlow's gRPC server aborts when destroyed.
    """
    set_grpc_fail_fast()  # before TensorFlow starts
    import tensorflow as tf

    training = task.training_spec
    me = f"{task.name} at {task.address}"
    with grpc_bind_errors(task):
        server = tf.distribute.Server(
            tf.train.ClusterSpec(training.as_dict()), job_name=task.type, task_index=task.index, protocol="grpc",
            config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=training.num_tasks + 1), start=True,
        )
    chief = PeerWatch.of(task.leader)
    chief.wait_up(connect_timeout, why=f"{me} serves it")
    if verbose:
        print(f"tfdist: {me} serving {chief.name} at {chief.address}", flush=True)
    while not chief.gone():
        time.sleep(POLL_SECONDS)
    if verbose:
        print(f"tfdist: {me}: {chief.name} is done; stopping", flush=True)
    del server
    _exit_now(0)
