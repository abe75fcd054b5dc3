"""What each task of a cluster does, and the waits between tasks that keep a cluster from hanging.

``python -m tfdist.train`` runs the same command on every task; the task's
type decides its role (``role``):

- ``train``: the chief and workers of ``multi_worker_mirrored`` (all train,
  the leader writes the outputs), the chief of ``parameter_server`` (it runs
  the ``ClusterCoordinator``), or a single process.
- ``serve``: the ``ps`` and ``worker`` tasks of ``parameter_server``. They
  start a ``tf.distribute.Server`` and serve the chief's requests until the
  chief is done (``serve``).
- ``evaluate``: the ``evaluator`` task, a side-car under either strategy. It
  never joins the training cluster: training tasks see a TF_CONFIG without
  it (``training_spec``), because ``MultiWorkerMirroredStrategy`` would give
  an evaluator a cluster of its own and ``ParameterServerStrategy``'s
  coordinator connects to every task it is told of. It evaluates each new
  checkpoint of ``model_dir/checkpoints`` (``evaluate_checkpoints``).

How a task knows its peers are up or gone: a TCP probe of their gRPC port
(``PeerWatch``). TensorFlow gives no "the chief is done" signal to a ps or
worker task, and its gRPC server has no clean stop, so a serving task waits
for the chief's port to answer (at most ``--connect_timeout``) and ends, with
status 0, once it stops answering. A training task that waits too long for
its peers to form the cluster (``joining``), or loses one mid-run
(``peer_errors``), ends with one line instead of a hang or a traceback.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import sys
import time
from pathlib import Path
from typing import NoReturn

from tfdist import cluster as cluster_lib
from tfdist import local_cluster
from tfdist.errors import RunFailed, UserError

#: Seconds between two probes of a peer.
POLL_SECONDS = 1.0

#: Failed probes in a row after which a peer that was up counts as gone (a task's port is closed for a
#: moment between the rendezvous of ``joining`` and TensorFlow's bind).
MISSES_FOR_GONE = 5

#: TensorFlow error types (by name) that mean a peer of the cluster was lost or stopped answering.
PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError")


class PeerLost(RunFailed):
    """A task of the cluster was lost mid-run; relaunching the cluster resumes from the last checkpoint (exit 4)."""

    exit_code = 4


def role(task_type: str, strategy: str) -> str:
    """``"train"``, ``"serve"`` or ``"evaluate"``: what a task of ``task_type`` does under ``strategy``."""
    if task_type == "evaluator":
        return "evaluate"
    if strategy == "parameter_server" and task_type in ("ps", "worker"):
        return "serve"
    return "train"


def training_spec(spec: cluster_lib.ClusterSpec) -> cluster_lib.ClusterSpec:
    """The cluster without its evaluator: the tasks that train (or serve) together."""
    return cluster_lib.ClusterSpec(
        tasks={t: a for t, a in spec.tasks.items() if t != "evaluator"}, source=spec.source
    )


def _name(task_type: str, index: int) -> str:
    return f"{task_type}:{index}"


def check_port_free(spec: cluster_lib.ClusterSpec, task_type: str, index: int) -> None:
    """Refuse to start a task whose port another process holds (before TensorFlow starts).

    Raises:
        UserError: the port of ``task_type:index`` is already bound.
    """
    address = spec.address(task_type, index)
    _, port = cluster_lib.split_address(address)
    if local_cluster.port_in_use(port):
        raise UserError(
            f"Address already in use: {address}, the address of {_name(task_type, index)} in "
            f"the cluster of {spec.source}. Received: port {port} taken by another process. "
            "Expected a free port: stop that process (an earlier run?) or change the port, "
            "or let `python -m tfdist.launch --local` pick free ports."
        )


class PeerWatch:
    """Whether one peer's gRPC port answers, probe after probe: first seen up, then gone.

    Args:
        name: the peer's task, e.g. ``"chief:0"`` (for messages).
        address: its ``host:port``.
        misses: failed probes in a row, after it was seen, that make it gone.
    """

    def __init__(self, name: str, address: str, *, misses: int = MISSES_FOR_GONE):
        self.name = name
        self.address = address
        self.misses = misses
        self.seen = False
        self._missed = 0

    def probe(self) -> bool:
        """One TCP probe; remembers that the peer was seen and counts misses in a row."""
        up = local_cluster.answers(self.address)
        self.seen = self.seen or up
        self._missed = 0 if up else self._missed + 1
        return up

    def wait_up(self, timeout: float, *, why: str) -> None:
        """Probe until the peer answers, for at most ``timeout`` seconds.

        Raises:
            UserError: it never answered (the message says ``why`` we wait for it).
        """
        deadline = time.monotonic() + timeout
        while not self.probe():
            if time.monotonic() >= deadline:
                raise UserError(
                    f"No answer from {self.name} at {self.address} within --connect_timeout={timeout:g}s ({why}). "
                    f"Received: no TCP connection to {self.address}. Expected that task to be started with the "
                    "same cluster spec and reachable from here (or a larger --connect_timeout)."
                )
            time.sleep(POLL_SECONDS)

    def gone(self) -> bool:
        """Probe once; True when the peer was seen and has now missed ``misses`` probes in a row."""
        self.probe()
        return self.seen and self._missed >= self.misses


def leader_watch(spec: cluster_lib.ClusterSpec) -> PeerWatch:
    """A ``PeerWatch`` on the task that leads the cluster (chief, else worker 0)."""
    task_type, index = spec.leader()
    return PeerWatch(_name(task_type, index), spec.address(task_type, index))


def _exit_now(status: int) -> NoReturn:
    """End the process at once, after flushing stdio.

    A serving task ends this way because TensorFlow's gRPC server cannot be
    stopped: destroying it aborts the process ("Clean shutdown is not
    currently implemented").
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _listen(address: str) -> socket.socket:
    """A plain listening socket on this task's port, so that peers see it up before TensorFlow binds."""
    host, port = cluster_lib.split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Probes only connect: the kernel accepts them into the backlog, nothing reads. SO_REUSEADDR is set.
    try:
        return socket.create_server((host, port), family=family, backlog=64)
    except OSError:  # a host name this machine does not resolve to itself: every interface, as gRPC does
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=64)
        return socket.create_server(("", port), backlog=64)


@contextlib.contextmanager
def joining(spec: cluster_lib.ClusterSpec | None, task_type: str, index: int, timeout: float, *,
            listen: bool = False):
    """Wait, at most ``timeout`` seconds, until every peer is up; then run the block that forms the cluster.

    The strategies' constructors wait for every peer in C++ with no limit and
    while holding the GIL, so no Python thread can bound them. Instead the
    peers meet before TensorFlow binds its port: each probes the others'
    ports until all have answered once (a rendezvous). With ``listen`` (the
    tasks of ``multi_worker_mirrored``, which all wait for each other) this
    task keeps a plain socket listening on its own port meanwhile, so that
    its peers see it too. A peer that never answers becomes a ``UserError``
    naming it (status 2). A peer lost between the rendezvous and the end of
    the block cannot be reported that way: ``faulthandler`` then ends the
    process after another ``timeout`` (status 1, with the stacks). A port
    gRPC cannot bind becomes a ``UserError`` naming the address.
    """
    if spec is None or spec.num_tasks < 2:
        yield
        return
    me = _name(task_type, index)
    address = spec.address(task_type, index)
    waiting = [PeerWatch(_name(t, i), spec.address(t, i)) for t, i in spec.task_list() if (t, i) != (task_type, index)]
    deadline = time.monotonic() + timeout
    listener = _listen(address) if listen else None
    try:
        while waiting:
            waiting = [peer for peer in waiting if not peer.probe()]
            if waiting and time.monotonic() >= deadline:
                silent = ", ".join(f"{peer.name} at {peer.address}" for peer in waiting)
                raise UserError(
                    f"No answer within --connect_timeout={timeout:g}s from {silent}. Received: no TCP connection "
                    f"from {me} at {address} (cluster of {spec.source}). Expected every task of the cluster "
                    "started with the same cluster spec and reachable from here (or a larger --connect_timeout)."
                )
            time.sleep(0.2 if waiting else 0)
    finally:
        if listener is not None:
            listener.close()
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        with grpc_bind_errors(me, address):
            yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def grpc_bind_errors(name: str, address: str):
    """Turn gRPC's "Could not start gRPC server" (its port taken) into a ``UserError`` naming the address."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only gRPC's bind failure is rewritten, the rest re-raised
        if "Could not start gRPC server" in str(e):
            raise UserError(
                f"Address already in use: TensorFlow could not start the gRPC server of {name} at {address}. "
                f"Received: {type(e).__name__}: {str(e).strip()}. Expected a free port for {address}."
            ) from None
        raise


def _reason(error: Exception) -> str:
    """The informative line of a TensorFlow error about a lost peer (not "Graph execution error")."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines() if line.strip()]
    for line in lines:
        if "aborted by:" in line:  # "Collective ops is aborted by: <the cause>"
            return line.split("aborted by:", 1)[1].strip() or line
    useful = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node", "File "))]
    return (useful or lines or [type(error).__name__])[0][:300]


@contextlib.contextmanager
def peer_errors(spec: cluster_lib.ClusterSpec | None, task_type: str, index: int, strategy: str, model_dir: str):
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
        if spec is None or spec.num_tasks < 2 or type(e).__name__ not in PEER_ERRORS:
            raise
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(str(Path(model_dir) / "checkpoints"))
        timed_out = " and every collective to finish within --collective_timeout" if isinstance(
            e, tf.errors.DeadlineExceededError) else ""
        raise PeerLost(
            f"Lost a task of the {strategy} cluster, or it stopped answering (this is {_name(task_type, index)}): "
            f"{_reason(e).rstrip('.')}. Received: {type(e).__name__} from TensorFlow. Expected every task to stay "
            f"up until the end{timed_out}; relaunch the whole cluster (e.g. python -m tfdist.launch "
            f"--max_restarts 1) to resume from the latest checkpoint ({latest or 'none saved yet'})."
        ) from None


def finish_together(spec: cluster_lib.ClusterSpec | None, strategy: str, timeout: float) -> None:
    """``multi_worker_mirrored``: wait until every worker is done (the leader exports last) before exiting.

    TensorFlow's coordination service makes every task wait at exit for all
    the others; a worker that leaves first is taken for a crashed one only
    after the heartbeat timeout (7 s lost per run, measured). A barrier at the
    end lets them all leave together. Lost peers surface as TensorFlow errors
    (see ``peer_errors``).
    """
    if strategy != "multi_worker_mirrored" or spec is None or training_spec(spec).num_tasks < 2:
        return
    from tensorflow.python.eager import context  # the coordination service's barrier has no public API

    context.context().wait_at_barrier("tfdist-finished", int(timeout * 1000))


def serve(spec: cluster_lib.ClusterSpec, task_type: str, index: int, *, connect_timeout: float,
          verbose: bool = True) -> NoReturn:
    """A ps or worker task of ``parameter_server``: serve the chief until it is done, then end with status 0.

    The chief must answer within ``connect_timeout`` (else a ``UserError``,
    status 2). Once it has been seen, the task ends when the chief's port
    stops answering (``MISSES_FOR_GONE`` probes in a row): the chief is done,
    or lost, and either way nothing is left to serve. The process ends with
    ``os._exit`` because TensorFlow's gRPC server aborts when destroyed.
    """
    from tfdist import strategies

    strategies.grpc_fail_fast_for_parameter_server()  # before TensorFlow starts
    import tensorflow as tf

    training = training_spec(spec)
    me = f"{_name(task_type, index)} at {training.address(task_type, index)}"
    with grpc_bind_errors(_name(task_type, index), training.address(task_type, index)):
        server = tf.distribute.Server(
            tf.train.ClusterSpec(training.as_dict()), job_name=task_type, task_index=index, protocol="grpc",
            config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=training.num_tasks + 1), start=True,
        )
    chief = leader_watch(training)
    chief.wait_up(connect_timeout, why=f"{me} serves it")
    if verbose:
        print(f"tfdist: {me} serving {chief.name} at {chief.address}", flush=True)
    while not chief.gone():
        time.sleep(POLL_SECONDS)
    if verbose:
        print(f"tfdist: {me}: {chief.name} is done; stopping", flush=True)
    del server
    _exit_now(0)


def evaluate_checkpoints(spec: cluster_lib.ClusterSpec, config, *, model, eval_dataset,
                         verbose: bool = True) -> dict:
    """The evaluator side-car: evaluate each new checkpoint of ``model_dir/checkpoints``.

    Rows go to ``model_dir/evaluator.jsonl`` (``split: "evaluator"``) and
    scalars to ``tensorboard/evaluator``, never into the chief's files. It
    ends after evaluating the final checkpoint, once the chief has written
    ``summary.json`` (one newer than the evaluator's start, so that a resumed
    run's old summary does not count). If the leader never answers within
    ``--connect_timeout`` it ends with a ``UserError``; if the leader stops
    answering before that summary, with ``RunFailed``.

    Args:
        spec: the cluster (for the leader's address).
        config: the run's config.
        model: a model built like the training one (variables to restore into).
        eval_dataset: a finite dataset of ``(images, masks)`` batches.
        verbose: print a line per evaluated checkpoint.

    Returns:
        ``{"role": "evaluator", "evaluated": [steps...], "last": metrics}``.
    """
    import numpy as np
    import tensorflow as tf

    from tfdist.training.metrics import metrics_from_stats
    from tfdist.training.outputs import RunOutputs
    from tfdist.training.step import Steps, stats_size

    model_dir = Path(config.train.model_dir)
    directory = str(model_dir / "checkpoints")
    summary = model_dir / "summary.json"
    started = time.time()
    num_classes = config.data.num_classes
    steps = Steps(model=model, optimizer=None, num_classes=num_classes,
                  global_batch_size=config.train.global_batch_size)
    eval_batch = tf.function(steps.evaluate)
    checkpoint = tf.train.Checkpoint(model=model)
    outputs = RunOutputs(model_dir=str(model_dir), is_chief=True, metrics_file="evaluator.jsonl")
    leader = leader_watch(training_spec(spec))
    leader.wait_up(config.runtime.connect_timeout, why="the evaluator follows its checkpoints")
    evaluated: list[int] = []
    last_path, last = None, None

    def summary_written() -> bool:
        return summary.exists() and summary.stat().st_mtime >= started

    try:
        while True:
            path = tf.train.latest_checkpoint(directory)
            if path and path != last_path:
                try:
                    checkpoint.restore(path).expect_partial()
                except (tf.errors.NotFoundError, tf.errors.DataLossError):
                    time.sleep(POLL_SECONDS)  # rotated away or not complete yet: read the index again
                    continue
                step = int(path.rsplit("-", 1)[1])
                total = np.zeros([stats_size(num_classes)], np.float32)
                for batch in eval_dataset:
                    total += eval_batch(batch).numpy()
                last = metrics_from_stats(total, num_classes)
                outputs.log("evaluator", step, last)
                evaluated.append(step)
                last_path = path
                if verbose:
                    print(f"evaluator step {step}: loss {last['loss']:.4f}  pixel_accuracy "
                          f"{last['pixel_accuracy']:.4f}  mean_iou {last['mean_iou']:.4f}", flush=True)
                continue
            if summary_written():
                if tf.train.latest_checkpoint(directory) == last_path:
                    break
                continue
            if leader.gone():
                raise RunFailed(
                    f"The leader {leader.name} at {leader.address} stopped answering before it wrote {summary}. "
                    f"Received: checkpoints evaluated at steps {evaluated or 'none'}. "
                    "Expected the run to finish; relaunch it to resume from its latest checkpoint."
                )
            time.sleep(POLL_SECONDS)
    finally:
        outputs.close()
    return {"role": "evaluator", "evaluated": evaluated, "last": last, "model_dir": str(model_dir)}
