"""The network as tfdist sees it: free ports, "does this task answer", loopback and public addresses."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import random
import socket

from tfdist.cluster.address import split_address
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import UserError

#: Host names that always mean this machine.
LOOPBACK_NAMES = ("localhost", "ip6-localhost", "ip6-loopback")


#: The environment variable that confines ``free_ports`` to a range of ports, ``LO-HI``.
PORT_RANGE_ENV = "TFDIST_PORT_RANGE"

#: Per range, the next port this process tries: a process never hands out one port twice in a row.
_next_in_range: dict[tuple[int, int], int] = {}


def port_range() -> tuple[int, int] | None:
    """``(lo, hi)`` from ``TFDIST_PORT_RANGE`` (inclusive), or None when it is unset or empty.

    Raises:
        UserError: it is not ``LO-HI`` with ``1 <= LO <= HI <= 65535``.
    """
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return None
    lo, _, hi = text.partition("-")
    try:
        bounds = int(lo), int(hi)
    except ValueError:
        bounds = (0, 0)
    if not 1 <= bounds[0] <= bounds[1] <= 65535:
        raise UserError(f"Invalid {PORT_RANGE_ENV}. Received: {text!r}. Expected LO-HI, e.g. 20000-24999.")
    return bounds


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now (in ``TFDIST_PORT_RANGE`` if set)."""
    bounds = port_range()
    if bounds is not None:
        return _free_ports_in(bounds, count)
    with contextlib.ExitStack() as stack:
        sockets = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]


def _free_ports_in(bounds: tuple[int, int], count: int) -> list[int]:
    """``count`` free ports of ``bounds``, tried in turn from where this process stopped last time."""
    lo, hi = bounds
    size = hi - lo + 1
    start = _next_in_range.get(bounds, lo + random.randrange(size))
    found: list[int] = []
    for offset in range(size):
        port = lo + (start - lo + offset) % size
        if not port_in_use(port):
            found.append(port)
            if len(found) == count:
                _next_in_range[bounds] = lo + (port - lo + 1) % size
                return found
    raise UserError(
        f"No {count} free ports in {PORT_RANGE_ENV}={lo}-{hi}. Received: {len(found)} free. "
        f"Expected a wider range, or {PORT_RANGE_ENV} unset to let the system pick."
    )


def answers(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (a cheap "is the task up")."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_in_use(port: int) -> bool:
    """Whether a TCP port is already bound for listening on this machine.

    TensorFlow's gRPC server listens on *every* interface (``0.0.0.0``,
    hard-coded in its ``grpc_server_lib.cc``) whatever host the cluster spec
    names, so the port is tried on the wildcard address. ``SO_REUSEADDR``
    keeps connections in TIME_WAIT (a task of an earlier run on that port)
    from counting: only a listening socket makes the port busy, as for gRPC.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def is_local_hostname(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a ``*.localhost`` name (RFC 6761: always this machine)."""
    host = host.lower().rstrip(".")
    return host == "localhost" or host.endswith(".localhost")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP literal or a name) is this machine's loopback, without a DNS lookup."""
    if host.lower() in LOOPBACK_NAMES or is_local_hostname(host):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_addresses(spec: ClusterSpec, *, include_hostnames: bool = True) -> list[str]:
    """The addresses that may be reachable from outside this machine's private networks.

    TensorFlow's gRPC servers have no authentication, so a caller warns when a
    cluster listens on such an address. An IP literal counts as public when
    ``ipaddress`` calls it global: loopback, private (10/8, 172.16/12,
    192.168/16, fc00::/7), link-local, shared (100.64/10), unspecified and
    reserved ranges are not. A host name cannot be classified without a DNS
    lookup, which this function never does (it must be fast and work offline),
    so every name except ``localhost`` and ``*.localhost`` counts as possibly
    public unless ``include_hostnames`` is false.

    Args:
        spec: a validated cluster.
        include_hostnames: whether to return addresses given by host name
            (other than localhost) as well as public IP literals.

    Returns:
        The matching addresses as written in the spec, in ``task_list`` order.
    """
    found = []
    for address in spec.addresses():
        host, _ = split_address(address)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            if include_hostnames and not is_local_hostname(host):
                found.append(address)
            continue
        if ip.is_global and not ip.is_multicast:
            found.append(address)
    return found


def listen(address: str) -> socket.socket:
    """A plain listening socket on this task's port, so that peers see it up before TensorFlow binds."""
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Probes only connect: the kernel accepts them into the backlog, nothing reads. SO_REUSEADDR is set.
    try:
        return socket.create_server((host, port), family=family, backlog=64)
    except OSError:  # a host name this machine does not resolve to itself: every interface, as gRPC does
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=64)
        return socket.create_server(("", port), backlog=64)
