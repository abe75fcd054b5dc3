"""Can this cluster start? Every task's host and port probed from here, before any task runs."""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import threading
import time
from typing import Callable, Sequence

from tfdist.cluster.address import split_address
from tfdist.cluster.network import port_in_use
from tfdist.cluster.spec import ClusterSpec

#: Seconds DNS may take for all hosts together.
DNS_TIMEOUT = 3.0
#: Seconds one TCP connect may take.
CONNECT_TIMEOUT = 1.5

#: Port states: what a peer would find at a task's port.
FREE, IN_USE, FILTERED, UNREACHABLE, ANSWERS, SILENT, UNKNOWN = (
    "free", "in use", "filtered?", "unreachable", "answers", "no answer", "-")


@dataclasses.dataclass(frozen=True)
class Probe:
    """What this machine found for one task.

    Attributes:
        task: ``type:index``.
        address: its ``host:port`` as the spec writes it.
        resolved: the IP addresses the host resolves to; empty when it does not.
        dns_error: why it does not resolve ("" when it does).
        local: whether the host is this machine.
        port: one of the port states (``FREE``, ``IN_USE``, ...).
        port_error: the connect error behind ``FILTERED``/``UNREACHABLE``/``SILENT``, for messages.
    """

    task: str
    address: str
    resolved: tuple[str, ...] = ()
    dns_error: str = ""
    local: bool = False
    port: str = UNKNOWN
    port_error: str = ""

    @property
    def public(self) -> bool | None:
        """Whether an address it resolves to is global (None: it does not resolve)."""
        if not self.resolved:
            return None
        return any(_is_public(ip) for ip in self.resolved)


def _is_public(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    return address.is_global and not address.is_multicast


def bounded(work: Callable[[str], object], items: Sequence[str], timeout: float) -> dict[str, object]:
    """``work(item)`` for every item in parallel threads; the results that came within ``timeout`` seconds.

    The threads are daemons: one stuck in a system call (a resolver that never
    answers) is left behind, and cannot keep the process from ending.
    """
    results: dict[str, object] = {}

    def run(item: str) -> None:
        results[item] = work(item)

    threads = [threading.Thread(target=run, args=(item,), daemon=True) for item in dict.fromkeys(items)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(results)


def _resolve(host: str) -> tuple[str, ...] | str:
    """The IPs of ``host`` (IPv4 first), or the resolver's error text."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        return getattr(e, "strerror", None) or str(e)
    ips = [info[4][0] for info in sorted(infos, key=lambda i: i[0] != socket.AF_INET)]
    return tuple(dict.fromkeys(ips))


def is_this_machine(ip: str) -> bool:
    """Whether ``ip`` is loopback or an address of this machine (a socket can bind it here)."""
    if ipaddress.ip_address(ip.split("%")[0]).is_loopback:
        return True
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


def connect_state(ip: str, port: int, timeout: float) -> tuple[bool | None, str]:
    """One TCP connect: (True: it connected, False: refused, None: no answer), and the error text."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect((ip, port))
        except ConnectionRefusedError:
            return False, "connection refused"
        except (TimeoutError, socket.timeout):
            return None, f"no answer within {timeout:g} s"
        except OSError as e:
            return None, e.strerror or type(e).__name__
    return True, ""


def _port_state(host_ips: tuple[str, ...], local: bool, port: int, *, running: bool,
                timeout: float) -> tuple[str, str]:
    """The port state of one task whose host resolved to ``host_ips``, and the error behind it."""
    if local and not running:
        return (IN_USE, "") if port_in_use(port) else (FREE, "")
    connected, error = connect_state(host_ips[0], port, timeout)
    if running:
        return (ANSWERS, "") if connected else (SILENT, error)
    if connected:
        return IN_USE, ""
    if connected is False:
        return FREE, ""
    return (UNREACHABLE if "unreachable" in error.lower() else FILTERED), error


def probe_cluster(spec: ClusterSpec, *, running: bool = False, dns_timeout: float = DNS_TIMEOUT,
                  connect_timeout: float = CONNECT_TIMEOUT) -> list[Probe]:
    """Probe every task of ``spec`` from this machine (see the module docstring); in ``task_list`` order.

    Takes at most about ``dns_timeout + connect_timeout`` seconds, whatever the hosts do.
    """
    tasks = [(f"{t}:{i}", spec.address(t, i)) for t, i in spec.task_list()]
    hosts = [split_address(address)[0] for _, address in tasks]
    dns = bounded(_resolve, hosts, dns_timeout)
    firsts: dict[str, Probe] = {}
    for (name, address), host in zip(tasks, hosts):
        found = dns.get(host, f"no answer from DNS within {dns_timeout:g} s")
        if isinstance(found, str) or not found:
            firsts[name] = Probe(task=name, address=address, dns_error=str(found or "no address"))
        else:
            firsts[name] = Probe(task=name, address=address, resolved=found,
                                 local=any(is_this_machine(ip) for ip in found))

    def port_of(name: str) -> tuple[str, str]:
        probe = firsts[name]
        return _port_state(probe.resolved, probe.local, split_address(probe.address)[1], running=running,
                           timeout=connect_timeout)

    resolved = [name for name, probe in firsts.items() if probe.resolved]
    ports = bounded(port_of, resolved, connect_timeout + 1.0)
    return [dataclasses.replace(probe, port=ports[name][0], port_error=ports[name][1])
            if name in ports else probe for name, probe in firsts.items()]


def problems(probes: Sequence[Probe], *, running: bool = False) -> list[str]:
    """One line per task that keeps the cluster from starting, each naming the task and the fix."""
    lines = []
    for p in probes:
        host, port = split_address(p.address)
        head = f"{p.task} ({p.address}):"
        if not p.resolved:
            lines.append(f"{head} the host does not resolve ({p.dns_error}). Fix: correct the host name in the "
                         f"cluster spec, or make it resolve on this machine (DNS, /etc/hosts), or use its IP address.")
        elif p.port == IN_USE and p.local:
            lines.append(f"{head} port {port} is in use by another process on this machine. Fix: stop that "
                         "process (an earlier run?) or give the task another port.")
        elif p.port == IN_USE:
            lines.append(f"{head} something already listens on {host}:{port} before the cluster has started. "
                         f"Fix: stop that process on {host} or give the task another port "
                         "(or --running, if the cluster should be up).")
        elif p.port in (FILTERED, UNREACHABLE):
            lines.append(f"{head} the port is closed (filtered by a firewall) or the host is down "
                         f"({p.port_error}). Fix: start the host, and open TCP port {port} on {host} to every "
                         "other host of the cluster.")
        elif p.port == SILENT:
            lines.append(f"{head} nothing answers at {p.address} ({p.port_error}). Fix: start that task "
                         "(python -m tfdist.tfconfig --cluster FILE --commands prints its command), or open "
                         f"TCP port {port} on {host}.")
        elif p.port == UNKNOWN:
            lines.append(f"{head} its port could not be probed in time. Fix: check the host and the network.")
    return lines


def warnings(probes: Sequence[Probe]) -> list[str]:
    """One line per task whose address may be reachable from outside (the cluster can still start)."""
    return [f"warning: {p.task} ({p.address}): the address may be public ({', '.join(p.resolved)}), and "
            "TensorFlow's gRPC server has no authentication. Fix: use private addresses, or firewall the port."
            for p in probes if p.public]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Aligned text columns: a header line, a rule, one line per row."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]


def table(probes: Sequence[Probe]) -> list[str]:
    """The probes as one table: task, address, resolves to, port, public?."""
    public = {True: "yes", False: "no", None: "?"}
    rows = [(p.task, p.address, ", ".join(p.resolved) or "(does not resolve)",
             f"{p.port} (this machine)" if p.local and p.port != UNKNOWN else p.port, public[p.public])
            for p in probes]
    return format_table(("task", "address", "resolves to", "port", "public?"), rows)

