"""What a ps or worker task under a coordinator does: serve the chief, then exit with the chief's status."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NoReturn

from tfdist.cluster.address import split_address
from tfdist.cluster.peers import POLL_SECONDS, PeerWatch, grpc_bind_errors
from tfdist.cluster.task import Task
from tfdist.errors import (DONE_EXIT_CODE, EXIT_CODES, PEER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE, USAGE_EXIT_CODE,
                           UserError, end_process)
from tfdist.runtime.preemption import SIGNALS, signal_name
from tfdist.strategies import set_grpc_fail_fast
from tfdist.runtime.placement import Placement
from tfdist.runtime.watchdog import Watchdog

def _exit_now(status: int) -> NoReturn:
    """End the process at once, after flushing stdio.

    A serving task ends this way because TensorFlow's gRPC server cannot be
    stopped: destroying it aborts the process ("Clean shutdown is not
    currently implemented").
    """
    end_process(status)


def status_path(task: Task) -> str:
    """Where the chief writes its exit status for ``task``: the temporary directory of ``task``'s machine.

    Named after the task's port, which no other process on that machine holds
    while the task runs. The chief and the task must agree on the temporary
    directory (``TMPDIR``, ``/tmp`` when unset).
    """
    _, port = split_address(task.address)
    return os.path.join(tempfile.gettempdir(), f"tfdist-{task.type}-{task.index}-port{port}.status")


def tell_servers(placement: Placement, status: int, timeout: float = 10.0) -> None:
    """The coordinating chief: tell every ps and worker task the status it ends with (see the module docstring).

    Each write is a remote op in a thread of its own, bounded by ``timeout``
    in all: a lost or preempted worker does not hold the chief up.
    """
    if not placement.is_chief:
        return
    import tensorflow as tf

    def write(peer: Task) -> None:
        try:
            with tf.device(f"/job:{peer.type}/replica:0/task:{peer.index}"):
                tf.io.write_file(status_path(peer), str(status))
        except Exception:  # a task that is gone has nothing to learn
            pass

    threads = [threading.Thread(target=write, args=(peer,), daemon=True)
               for peer in placement.peers() if peer.type in ("ps", "worker")]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


_telling_at_exit = False


def tell_servers_at_exit(placement: Placement) -> None:
    """The coordinating chief of a ``tfdist.setup`` session: tell the serving tasks how the script ended, once
    it ends (``tell_servers``), rather than at the end of a run.

    The ps and worker tasks then serve the whole script: every ``fit`` of it and the script's own
    ``ClusterCoordinator`` steps. The status is the script's: 0 at a normal exit, or that of the exception that
    left it (a tfdist error's exit code, 2 for a ``UserError``, else 1), told from ``sys.excepthook`` before
    the hooks after it run, since one of those may end the process at once. Install it after the other hooks;
    once per process.
    """
    global _telling_at_exit
    if _telling_at_exit or not (placement.coordinator and placement.is_chief):
        return
    _telling_at_exit = True
    told: list[int] = []

    def tell(status: int) -> None:
        if not told:
            told.append(status)
            tell_servers(placement, status)

    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        tell(USAGE_EXIT_CODE if issubclass(kind, UserError) else getattr(value, "exit_code", 1))
        return previous(kind, value, traceback)

    sys.excepthook = excepthook
    atexit.register(tell, DONE_EXIT_CODE)


def _read_status(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def serve(task: Task, *, connect_timeout: float, verbose: bool = True, heartbeats: Path | None = None) -> NoReturn:
    """A ps or worker task of a coordinated strategy: serve the chief until it is done, then end with its status.

    The chief must answer within ``connect_timeout`` (else a ``UserError``,
    status 2). Then the task serves until the chief writes its exit status
    (``tell_servers``) or its port stops answering (``MISSES_FOR_GONE``
    probes in a row), and ends with the chief's status, or 4 when the chief
    vanished without one. SIGTERM or SIGUSR1 (``preemption.SIGNALS``): a
    worker ends at once with status 42 (the chief reschedules its steps on
    the others, as after a lost worker); a ps task keeps serving, since the
    chief's checkpoint reads the variables it holds, and ends with the
    chief's status. The process ends with ``errors.end_process`` because TensorFlow's
    gRPC server aborts when destroyed.

    While it serves, the task keeps a heartbeat in ``heartbeats`` (the run
    directory's, ``runtime.watchdog``), so that the chief's watchdog can
    name a server that stopped; it is removed when the run ended well.
    """
    set_grpc_fail_fast()  # before TensorFlow starts
    import tensorflow as tf

    training = task.training_spec
    me = f"{task.name} at {task.address}"
    path = status_path(task)
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)  # an earlier run's
    def on_signal(signum, frame) -> None:
        if task.type == "worker":
            print(f"tfdist: {me} received {signal_name(signum)}; stopping (the chief reschedules its steps on "
                  "the other workers)", flush=True)
            with contextlib.suppress(OSError):
                os.remove(path)  # a status the chief wrote already: nobody reads it now
            _exit_now(PREEMPTED_EXIT_CODE)
        print(f"tfdist: {me} received {signal_name(signum)}; serving until {task.leader.name} ends (its "
              "checkpoint reads the variables held here)", flush=True)

    for signum in SIGNALS:
        signal.signal(signum, on_signal)
    with grpc_bind_errors(task):
        server = tf.distribute.Server(
            tf.train.ClusterSpec(training.as_dict()), job_name=task.type, task_index=task.index, protocol="grpc",
            config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=training.num_tasks + 1), start=True,
        )
    chief = PeerWatch.of(task.leader)
    chief.wait_up(connect_timeout, why=f"{me} serves it")
    if verbose:
        print(f"tfdist: {me} serving {chief.name} at {chief.address}", flush=True)
    watchdog = Watchdog(task=task.name, tasks=[task.name], directory=heartbeats, timeout=0) if heartbeats else None
    if watchdog is not None:
        watchdog.start(phase="serving")
    status = None
    while status is None and not chief.gone():
        time.sleep(POLL_SECONDS)
        status = _read_status(path)
    # Told: let the chief leave first (bounded), so that it does not reach for a task that is gone.
    deadline = time.monotonic() + connect_timeout
    while not chief.gone() and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    status = _read_status(path) if status is None else status
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    if watchdog is not None:
        watchdog.stop(ended_well=status == DONE_EXIT_CODE)
    del server
    if status is None:
        # Not a PeerLost raised: the gRPC server cannot be destroyed, so the process ends here, with one line.
        sys.stderr.write(
            f"error: {chief.name} at {chief.address} stopped answering without telling {me} how the run ended "
            f"(killed or crashed). Received: no status from it. Expected the chief to finish or be preempted; "
            f"relaunch the whole cluster to resume from its latest checkpoint.\n"
        )
        _exit_now(PEER_LOST_EXIT_CODE)
    if verbose:
        print(f"tfdist: {me}: {chief.name} ended with status {status} ({EXIT_CODES.get(status, 'a failure')}); "
              "stopping", flush=True)
    _exit_now(status)
