"""A task's life in its cluster, for every run the driver assembles (``runtime.driver.run``).

``evaluating_task`` starts an evaluator (one device, no strategy); ``training_task`` starts a training task
(``session.start``) and trains its ``with`` block under ``Preemption`` and ``among_peers`` (a lost peer is one
line; the tasks finish together); under a coordinator it tells the serving tasks how the run ended (in a
``tfdist.setup`` session, only a failure that ends the script: the session tells them the rest at exit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from typing import Any, Iterator

from tfdist import _compat
from tfdist.cluster.network import answers
from tfdist.cluster.task import Task
from tfdist.errors import DONE_EXIT_CODE, USAGE_EXIT_CODE, PeerLost, RunFailed, UserError, collective_failure
from tfdist.rundir import RunDir
from tfdist.runtime import who
from tfdist.runtime.placement import Placement
from tfdist.runtime.preemption import Preemption
from tfdist.runtime.serving import tell_servers
from tfdist.runtime.session import start
from tfdist.runtime.watchdog import stopped_tasks


@dataclasses.dataclass(frozen=True)
class Training:
    """What a training task trains with (``runtime.run_loop`` takes it).

    Attributes:
      placement: this task.
      run_dir: the run directory (heartbeats).
      strategy: the ``tf.distribute.Strategy``.
      preemption: this task's ``Preemption``.
      progress_timeout: ``--progress_timeout``, the watchdog's bound.
    """

    placement: Placement
    run_dir: RunDir
    strategy: Any
    preemption: Preemption
    progress_timeout: float


@contextlib.contextmanager
def evaluating_task(placement: Placement) -> Iterator[None]:
    """Start an evaluator task for the ``with`` block: one CPU device and no strategy, since it joins no
    collective and reads the chief's checkpoints alone; a preemption ends it at once (status 42: it has nothing
    to save)."""
    from tfdist import strategies

    with Preemption(placement.name):
        strategies.setup_host(cpu_devices=1)
        yield


@contextlib.contextmanager
def training_task(runtime, placement: Placement, run_dir: RunDir, *, cluster_resolver=None,
                  verbose: bool = True) -> Iterator[Training]:
    """Start this task (``session.start``: a ``tfdist.setup`` session is taken over) and yield its ``Training``;
    the block trains.

    Args:
      runtime: the run's ``RuntimeConfig`` (strategy, devices, timeouts).
      placement: this task.
      run_dir: the run directory (heartbeats of a serving task, the latest checkpoint of a lost-peer line).
      cluster_resolver: an in-process cluster this process coordinates, or None.
      verbose: a serving task prints what it does.
    """
    def started():
        return start(runtime, placement, cluster_resolver=cluster_resolver, heartbeats=run_dir.heartbeats,
                     verbose=verbose)

    if placement.role == "serve":
        started()  # serves, with its own signal handling, and never returns
    # A tfdist.setup session's servers serve the whole script, and learn how it ended when it ends
    # (serving.tell_servers_at_exit): a run tells them only a failure that ends it (preempted, diverged, lost).
    tells = placement.coordinator and who.current() is None
    with Preemption(placement.name) as preemption:
        try:
            strategy = started().strategy
            with among_peers(placement, run_dir, timeout=runtime.connect_timeout):
                yield Training(placement=placement, run_dir=run_dir, strategy=strategy, preemption=preemption,
                               progress_timeout=runtime.progress_timeout)
        except RunFailed as e:
            if placement.coordinator:
                tell_servers(placement, e.exit_code)
            raise
        except UserError:
            if tells:
                tell_servers(placement, USAGE_EXIT_CODE)
            raise
    if tells:
        tell_servers(placement, DONE_EXIT_CODE)


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
def among_peers(placement: Placement, run_dir: RunDir, *, timeout: float):
    """Run the ``with`` block among the cluster's peers, then finish together with them (``finish_together``,
    bounded by ``timeout``); TensorFlow's errors about a lost peer become one ``PeerLost`` line (exit status 4),
    another error of a collective one ``CollectiveFailed`` line that names it and the worker (``collective_failure``).

    Under ``multi_worker_mirrored`` every collective needs every worker: when
    one is lost, TensorFlow's coordination service (heartbeats) or the gRPC
    connection aborts the collectives of the others within seconds, and
    ``--collective_timeout`` bounds a collective that waits on a peer that
    is up but stuck. Under ``parameter_server`` a lost worker is handled by
    the coordinator; a lost ps task ends the run here.
    """
    try:
        yield
        finish_together(placement, timeout)
    except Exception as e:
        task = placement.task
        failed = collective_failure(e, task.name, placement.num_workers, "training") \
            if task.spec.num_tasks > 1 and type(e).__name__ not in PEER_ERRORS else None
        if failed is not None:
            raise failed from None
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
    (see ``among_peers``).
    """
    task = placement.task
    if not placement.traits.ends_with_barrier or task.training_spec.num_tasks < 2:
        return
    _compat.wait_at_barrier("tfdist-finished", int(timeout * 1000))
