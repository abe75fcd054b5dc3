"""Hosts of our own on this machine: network namespaces on a private bridge, for "several hosts, by hand".

``Hosts(count)`` (a context manager) makes ``count`` network namespaces
``tfdist-ns-<pid>-<i>``, each with one end of a veth pair (``eth0``, address
``10.214.<x>.<i+1>/24``) whose other end is on a bridge ``tfbr<pid>`` of the
root namespace, and ``lo`` up. The bridge has no address: the root namespace
has no route into the subnet, so nothing outside these namespaces can reach
them, nor be reached by mistake; ``x`` differs per pytest-xdist worker.
``command(i, argv)`` runs ``argv`` inside namespace ``i``. On exit (passed or
not) every namespace and the bridge are deleted; namespaces a killed test
session left behind (their pid is gone) are deleted on the way in.

Needs root and ``ip netns``: ``unavailable()`` says why not, for a skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

PREFIX = "tfdist-ns-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def unavailable() -> str | None:
    """Why namespaces cannot be made here (for ``pytest.skip``), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def subnet_octet(worker: str | None = None) -> int:
    """The third octet of this pytest worker's subnet 10.214.<x>.0/24 (gw0: 100, gw1: 101, ...; master: 99)."""
    worker = worker if worker is not None else os.environ.get("PYTEST_XDIST_WORKER", "master")
    return 100 + int(worker[2:]) % 150 if worker.startswith("gw") and worker[2:].isdigit() else 99


def remove_stale() -> None:
    """Delete namespaces (and their bridges) of earlier test sessions whose process is gone."""
    listed = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({re.escape(PREFIX)}(\d+)-\S+)", listed, re.M):
        full, pid = name
        if not os.path.exists(f"/proc/{pid}"):
            _ip("netns", "del", full, check=False)
            _ip("link", "del", f"tfbr{pid}", check=False)


class Hosts:
    """``count`` namespaces on one bridge; ``address(i)``, ``command(i, argv)``; everything deleted on exit."""

    def __init__(self, count: int):
        self.count = count
        self.pid = os.getpid()
        self.octet = subnet_octet()
        self.bridge = f"tfbr{self.pid}"
        self.names = [f"{PREFIX}{self.pid}-{i}" for i in range(count)]

    def address(self, i: int) -> str:
        return f"10.214.{self.octet}.{i + 1}"

    def command(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``i`` (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def __enter__(self) -> Hosts:
        remove_stale()
        try:
            self._make()
        except BaseException:
            self.delete()
            raise
        return self

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            veth = f"tfv{self.pid}-{i}"
            _ip("netns", "add", name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def delete(self) -> None:
        """Delete every namespace (their veth pairs go with them) and the bridge; what is already gone is fine."""
        for i, name in enumerate(self.names):
            _ip("link", "del", f"tfv{self.pid}-{i}", check=False)  # at once (a namespace's own go lazily)
            _ip("netns", "del", name, check=False)
        _ip("link", "del", self.bridge, check=False)

    def __exit__(self, *exc) -> None:
        self.delete()
