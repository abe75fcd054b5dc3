"""Real ``python -m tfdist.train`` runs, alone or under ``tfdist.launch --local``, that the benchmark's parent
starts, signals and reads without importing TensorFlow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from tfdist.cluster.network import free_ports

#: How often a parent looks at a run's ``metrics.jsonl`` and its processes.
POLL_SECONDS = 0.05


def rows(metrics: Path, split: str) -> list[dict]:
    """The rows of ``split`` (``"train"``, ``"eval"``) in a run's ``metrics.jsonl`` so far.

    The run appends while the parent reads, so a last line being written (not yet JSON) is skipped; a file not
    yet there has no rows.
    """
    try:
        lines = metrics.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("split") == split:
            out.append(row)
    return out


def train_command(flags: Sequence[str], directory: Path, cluster: Mapping[str, int] | None = None) -> list[str]:
    """``python -m tfdist.train FLAGS``; under the launcher when ``cluster`` gives task counts (e.g. ``{"worker": 2}``).

    The cluster file is written into ``directory``, every task on a free port of 127.0.0.1.
    """
    train = [sys.executable, "-m", "tfdist.train", *flags]
    if not cluster:
        return train
    ports = iter(free_ports(sum(cluster.values())))
    lines = [f"{job}: [" + ", ".join(f"127.0.0.1:{next(ports)}" for _ in range(count)) + "]"
             for job, count in cluster.items()]
    path = directory / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return [sys.executable, "-m", "tfdist.launch", f"--cluster={path}", "--local", "--", *train]


class Process:
    """A started command: its own session (its group is killed by ``kill``), its output in files of ``directory``.

    Args:
      argv: the command.
      directory: where its stdout/stderr files go (and its TMPDIR: scratch files go with the directory).
      name: the files' stem.
      label: how errors name the measurement (``"preemption benchmark"``).
      env: variables added to its environment (e.g. ``runtime.hold``'s), or None.
    """

    def __init__(self, argv: list[str], directory: Path, name: str, label: str = "preemption benchmark",
                 env: Mapping[str, str] | None = None):
        import time

        env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **(env or {})}
        env.update(TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(directory))
        self.label = label
        self.out, self.err = directory / f"{name}.out", directory / f"{name}.err"
        self.started_at = time.time()
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)

    def text(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def wait(self, timeout: float, what: str) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self.label}: no {what} after {timeout:g} s: {self.text()[-1500:]}") from None

    def kill(self) -> None:
        """SIGKILL to the process's group, if it is still running; then reap it."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(timeout=30)
