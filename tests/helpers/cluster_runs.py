"""Helpers for the tests that run clusters of real processes on 127.0.0.1.

Every process is started in its own process group, its output goes to a file
under the test's tmp_path, every wait is bounded, and ``Processes`` kills
whatever is left (by process group) when a test ends, passed or not. Tests
that check the launcher leaves nothing behind look at its descendants with
psutil (``descendants``, ``alive``). Ports come from this pytest worker's own
range, below the ephemeral range (``worker_port_range``, set by conftest).

The 40-step multi-worker experiment below is shared: its uninterrupted run
(two workers and an evaluator under the launcher, ``launched_multi_worker``)
is made once per session (``shared``), checked by ``test_multi_worker.py``
and compared with the interrupted and resumed runs of ``test_faults.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import numpy as np
import psutil
import pytest

from helpers.clis import REPO, child_env, cli_argv
from tfdist.cluster.network import free_ports


#: A tiny deterministic experiment, long enough (40 steps, a checkpoint every 10) to be interrupted mid-run.
#: Two workers and one process drift apart over such a run (float sums in another order, amplified by
#: training: 8e-6 after 6 steps, 1e-3 after 16, 0.1 after 40, measured), so ``SHORT`` compares those.
#: Without the final export, which none of them reads but one: that test adds ``--export``.
EXPERIMENT = [
    "--image_size=32", "--train_examples=64", "--eval_examples=16", "--base_filters=4",
    "--depth=2", "--global_batch_size=8", "--optimizer=sgd", "--learning_rate=0.05", "--lr_decay=none",
    "--epochs=1", "--steps_per_epoch=40", "--log_every=5", "--checkpoint_every=10", "--deterministic", "--noexport",
]
MWM = ["--strategy=multi_worker_mirrored", *EXPERIMENT]
SHORT = [f.replace("steps_per_epoch=40", "steps_per_epoch=6") for f in EXPERIMENT]

#: Values computed once per test session (see ``shared``).
_SHARED: dict = {}


def shared(name: str, make: Callable[[], object]):
    """``make()`` the first time ``name`` is asked for in this session, the same value afterwards."""
    if name not in _SHARED:
        _SHARED[name] = make()
    return _SHARED[name]


def worker_port_range(worker: str, workers: int, ephemeral_low: int) -> str:
    """The ports of one pytest worker (``gw0``, ``gw1``, ...; ``master`` without xdist), below the ephemeral range.

    Ports from the system (port 0) come from the ephemeral range, where two
    pytest workers, and every outgoing connection's source port (gRPC's
    too), can take a port between ``free_ports`` and TensorFlow's bind. Each
    worker gets its own slice of 20000..ephemeral_low-1 (at most 5000 ports),
    gw0 first; "" (let the system pick) where there is no room.
    """
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = min(5000, (ephemeral_low - 20000) // max(1, workers))
    if width < 100:
        return ""
    lo = 20000 + index * width
    return f"{lo}-{lo + width - 1}"


def ephemeral_low() -> int:
    """The first port of the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def loopback_cluster(path: Path, **counts: int) -> Path:
    """Write a cluster spec with ``counts`` tasks of each type on free ports of 127.0.0.1."""
    ports = iter(free_ports(sum(counts.values())))
    lines = [f"{t}: [{', '.join(f'127.0.0.1:{next(ports)}' for _ in range(n))}]" for t, n in counts.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class Proc:
    """One started process: its own process group, output in ``log``, bounded waits."""

    def __init__(self, args: list[str], log: Path, *, env_vars: dict[str, str], cwd: Path = REPO):
        self.args = args
        self.log = log
        self._file = open(log, "wb")
        self.popen = subprocess.Popen(args, stdout=self._file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env_vars, cwd=cwd, start_new_session=True)
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """The exit status; kills the group and fails the test after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.args[:6]} still running after {timeout} s; output:\n{self.text()[-3000:]}")
        finally:
            self._file.close()

    def wait_watching(self, timeout: float) -> tuple[int, set[int]]:
        """``wait``, sampling this process's descendants meanwhile: (exit status, every pid seen among them)."""
        seen: set[int] = set()
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None and time.monotonic() < deadline:
            seen |= descendants(self.pid)
            time.sleep(0.2)
        return self.wait(max(1.0, deadline - time.monotonic())), seen

    def wait_for(self, found: Callable[[str], object], timeout: float, what: str):
        """Poll the output until ``found(text)`` is truthy; returns that value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = found(self.text())
            if value:
                return value
            if self.popen.poll() is not None:
                raise AssertionError(f"ended (status {self.popen.returncode}) before {what}:\n{self.text()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"no {what} after {timeout} s:\n{self.text()[-3000:]}")

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Signal the whole process group (nothing happens if it is gone)."""
        try:
            os.killpg(self.popen.pid, signum)
        except ProcessLookupError:
            pass


def descendants(pid: int) -> set[int]:
    """The pids of every process below ``pid`` (children, grandchildren, ...), alive now."""
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def alive(pids) -> list[int]:
    """Those of ``pids`` still alive (a zombie, already dead but not yet reaped, counts as gone)."""
    found = []
    for pid in sorted(pids):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def assert_none_left(pids) -> None:
    """None of ``pids`` is alive."""
    left = alive(pids)
    assert not left, f"processes left behind: {left}"


class Processes:
    """Start processes; on exit, SIGKILL every group still there and wait (a context manager)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.started: list[Proc] = []

    def start(self, name: str, args: list[str], **env_vars: str) -> Proc:
        """Start ``args``; temporary files (a worker's scratch checkpoints) go under the test's directory."""
        proc = Proc(args, self.directory / f"{name}.log", env_vars=child_env({"TMPDIR": str(self.directory), **env_vars}))
        self.started.append(proc)
        return proc

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.started:
            proc.kill()
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def launcher(cluster: Path, *command: str, local: bool = True, options: tuple[str, ...] = ()) -> list[str]:
    """argv of ``python -m tfdist.launch`` running ``command`` (a ``python -m tfdist.train`` by default)."""
    head = cli_argv("tfdist.launch", f"--cluster={cluster}", "--grace_seconds=3", *options)
    if local:
        head.append("--local")
    return [*head, "--", *command]


def train_command(*flags: str) -> list[str]:
    """argv of ``python -m tfdist.train FLAGS``."""
    return cli_argv("tfdist.train", *flags)


def started_pids(text: str) -> dict[str, int]:
    """``task -> pid`` from the launcher's ``[launch] worker:1 started (pid N)`` lines (the latest start)."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"\[launch\] (\S+) started \(pid (\d+)\)", text)}


def every_started_pid(text: str) -> set[int]:
    """The pids of every ``[launch] ... started (pid N)`` line, of every start."""
    return {int(pid) for pid in re.findall(r"\[launch\] \S+ started \(pid (\d+)\)", text)}


def latest_checkpoint_step(model_dir: Path) -> int:
    """The step of the checkpoint that ``model_dir/checkpoints/checkpoint`` names, or -1."""
    try:
        first = (model_dir / "checkpoints" / "checkpoint").read_text().splitlines()[0]
    except (OSError, IndexError):
        return -1
    match = re.search(r'ckpt-(\d+)"', first)
    return int(match.group(1)) if match else -1


def train_steps_logged(model_dir: Path) -> list[int]:
    """The steps of the train rows the chief has written to ``metrics.jsonl`` so far."""
    try:
        lines = (model_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [row["step"] for row in map(json.loads, lines) if row["split"] == "train"]


def npz_weights(path: Path) -> list[np.ndarray]:
    """The arrays of a ``--dump_weights`` file, in model order."""
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The largest absolute difference between two lists of same-shaped weights."""
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def launch_multi_worker(root, flags, **counts) -> dict:
    """``flags`` on a cluster of ``counts`` tasks under the launcher; status, output, model_dir, weights dir."""
    cluster = loopback_cluster(root / "cluster.yaml", **counts)
    model_dir, weights = root / "run", root / "weights"
    with Processes(root) as procs:
        proc = procs.start("launch", launcher(cluster, *train_command(
            *flags, f"--model_dir={model_dir}", f"--dump_weights={weights}")))
        status = proc.wait(300)
    return {"status": status, "text": proc.text(), "model_dir": model_dir, "weights": weights}


#: The mark of every test that reads ``launched_multi_worker``: under ``pytest -n`` (xdist's
#: ``--dist loadgroup``) they all run in one worker, so that the shared run is made once.
SHARED_RUN = pytest.mark.xdist_group("launched_multi_worker")


def launched_multi_worker(tmp_path_factory) -> dict:
    """The 40-step experiment on 2 workers and an evaluator, uninterrupted (once per session)."""
    return shared("launched_multi_worker",
                  lambda: launch_multi_worker(tmp_path_factory.mktemp("mwm"), MWM, worker=2, evaluator=1))
