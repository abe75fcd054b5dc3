"""Peers meeting and watching each other: a bounded rendezvous before TensorFlow binds, then liveness probes."""

from __future__ import annotations

import contextlib
import faulthandler
import time

from tfdist.cluster.address import split_address
from tfdist.cluster.network import answers, listen, port_in_use
from tfdist.cluster.task import Task
from tfdist.errors import UserError

#: Seconds between two probes of a peer.
POLL_SECONDS = 1.0

#: Failed probes in a row after which a peer that was up counts as gone (a task's port is closed for a
#: moment between the rendezvous of ``joining`` and TensorFlow's bind).
MISSES_FOR_GONE = 5


def check_port_free(task: Task) -> None:
    """Refuse to start a task whose port another process holds (before TensorFlow starts).

    Raises:
        UserError: the port of ``task`` is already bound.
    """
    _, port = split_address(task.address)
    if port_in_use(port):
        raise UserError(
            f"Address already in use: {task.address}, the address of {task.name} in "
            f"the cluster of {task.spec.source}. Received: port {port} taken by another process. "
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

    @classmethod
    def of(cls, task: Task) -> PeerWatch:
        """A watch on ``task``'s port."""
        return cls(task.name, task.address)

    def probe(self) -> bool:
        """One TCP probe; remembers that the peer was seen and counts misses in a row."""
        up = answers(self.address)
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


@contextlib.contextmanager
def joining(task: Task, timeout: float, *, listen_meanwhile: bool = False):
    """Wait, at most ``timeout`` seconds, until every peer is up; then run the block that forms the cluster.

    The peers of ``task`` in the training cluster meet before TensorFlow
    binds its port: each probes the others' ports until all have answered
    once (a rendezvous). With ``listen_meanwhile`` (strategies whose tasks
    all wait for each other) this task keeps a plain socket listening on its
    own port meanwhile, so that its peers see it too. A peer that never
    answers becomes a ``UserError`` naming it (status 2). A peer lost between
    the rendezvous and the end of the block cannot be reported that way:
    ``faulthandler`` then ends the process after another ``timeout`` (status
    1, with the stacks). A port gRPC cannot bind becomes a ``UserError``
    naming the address.
    """
    if task.training_spec.num_tasks < 2:  # Task.local() among them
        yield
        return
    waiting = [PeerWatch.of(peer) for peer in task.peers()]
    deadline = time.monotonic() + timeout
    listener = listen(task.address) if listen_meanwhile else None
    try:
        while waiting:
            waiting = [peer for peer in waiting if not peer.probe()]
            if waiting and time.monotonic() >= deadline:
                silent = ", ".join(f"{peer.name} at {peer.address}" for peer in waiting)
                raise UserError(
                    f"No answer within --connect_timeout={timeout:g}s from {silent}. Received: no TCP connection "
                    f"from {task.name} at {task.address} (cluster of {task.spec.source}). Expected every task of "
                    "the cluster started with the same cluster spec and reachable from here (or a larger "
                    "--connect_timeout)."
                )
            time.sleep(0.2 if waiting else 0)
    finally:
        if listener is not None:
            listener.close()
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        with grpc_bind_errors(task):
            yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def grpc_bind_errors(task: Task):
    """Turn gRPC's "Could not start gRPC server" (its port taken) into a ``UserError`` naming the address."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only gRPC's bind failure is rewritten, the rest re-raised
        if "Could not start gRPC server" in str(e):
            raise UserError(
                f"Address already in use: TensorFlow could not start the gRPC server of {task.name} at "
                f"{task.address}. Received: {type(e).__name__}: {str(e).strip()}. Expected a free port for "
                f"{task.address}."
            ) from None
        raise
