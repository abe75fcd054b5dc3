"""The groups of processes of a check, run side by side: one process, a 2-worker cluster, a coordinator.

A group trains its ``[seed, mode]`` pairs in order. A crash can leave the collectives of the processes that ran
it aborted, so that every later verdict of theirs would crash too: after a verdict that crashed (or a process
that died during one), the group starts again in fresh processes with the pairs after it, and each verdict they
give says so (``after_crash``). Past ``--timeout`` every group is stopped: the pair it was running is a timeout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from tfdist.check import runs

#: How often the groups' processes are polled, in seconds.
POLL_SECONDS = 0.2


def _command(group: str, spec: dict, directory: Path) -> list[str]:
    """The command of one group of processes: one process, or a 2-worker cluster under ``tfdist.launch``."""
    worker = [sys.executable, "-m", "tfdist.check.worker", json.dumps(spec)]
    if group != "workers":
        return worker
    cluster = directory / "cluster.yaml"
    cluster.write_text("worker: [127.0.0.1:1, 127.0.0.1:2]\n")  # tfdist.launch --local picks free ports
    return [sys.executable, "-m", "tfdist.launch", "--local", "--cluster", str(cluster), "--", *worker]


@dataclasses.dataclass
class Group:
    """One group's pairs left to run and its processes of the moment (``attempt`` counts its starts)."""

    name: str
    work: list[tuple[int, str]]
    attempt: int = 0
    after_crash: dict | None = None
    process: subprocess.Popen | None = None
    log: IO | None = None

    def start(self, directory: Path, model: str | None) -> None:
        spec = {"group": self.name, "work": self.work, "output": str(directory), "model": model,
                "attempt": self.attempt, "after_crash": self.after_crash}
        self.log = open(directory / f"{self.name}-{self.attempt}.log", "w")  # noqa: SIM115 - closed in end()
        self.process = subprocess.Popen(_command(self.name, spec, directory), stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def end(self) -> None:
        """Stop the processes (their whole session) if they still run, and close the log."""
        if self.process is not None:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None


def run_groups(seeds: list[int], modes: list[str], directory: Path, timeout: float,
               model: str | None = None) -> list[dict]:
    """Run every group of processes the modes need, side by side, each restarted after a crash; returns each
    process's report (one per process and start, its records those of its own pairs)."""
    names: dict[str, list[str]] = {}
    for mode in modes:
        names.setdefault(runs.MODES[mode].group, []).append(mode)
    groups = [Group(name, [(seed, mode) for seed in seeds for mode in members]) for name, members in names.items()]
    deadline = time.monotonic() + timeout  # one for every group: they run side by side
    reports: list[dict] = []
    try:
        for group in groups:
            group.start(directory, model)
        while any(group.process is not None for group in groups):
            time.sleep(POLL_SECONDS)
            timed_out = time.monotonic() > deadline
            for group in groups:
                if group.process is None or (group.process.poll() is None and not timed_out):
                    continue
                group.end()
                found, left, after = collect(group, directory, timeout if timed_out else None)
                reports += found
                if left and after is not None and not timed_out:
                    group.work, group.attempt, group.after_crash = left, group.attempt + 1, after
                    group.start(directory, model)
    finally:  # past the time, or this process stopped: no process of a group outlives it
        for group in groups:
            group.end()
    return reports


def collect(group: Group, directory: Path, timeout: float | None) -> tuple[list[dict], list, dict | None]:
    """The reports of a group's processes that ended, the pairs left to run, and the crashed pair to restart
    after (None: the group is done, timed out, or died before a pair ran).

    A pair that crashed on one task ends the start there: a task's verdict on a later pair is dropped (it runs
    again in fresh processes), and a task without a verdict on the crashed pair crashed with it. Stopped at the
    ``timeout`` (seconds), the pair each task ran is a timeout and the pairs after it are not run.
    """
    expected = 2 if group.name == "workers" else 1
    found = [json.loads(path.read_text()) for path in sorted(directory.glob(f"{group.name}-{group.attempt}-*.json"))]
    log = (directory / f"{group.name}-{group.attempt}.log").read_text(errors="replace")
    index = {tuple(pair): i for i, pair in enumerate(group.work)}
    if len(found) == expected and all(r.get("done") for r in found):
        return found, [], None
    if timeout is not None:
        for report in found:
            running = report.get("running")
            if running is not None:
                report["records"].append({"seed": running[0], "mode": running[1], "class": "timeout",
                                          "detail": f"still running when --timeout {timeout:g} s had passed (the "
                                                    "groups run side by side)", **_fresh(group)})
        ran = {(r["seed"], r["mode"]) for report in found for r in report["records"]}
        left = [pair for pair in group.work if tuple(pair) not in ran]
        return [*found, {"group": group.name, "task": group.name, "not_run": left, "records": []}], left, None
    stops = [index[(r["seed"], r["mode"])] for report in found for r in report["records"]
             if r["class"] == "crashed" and (r["seed"], r["mode"]) in index]
    stops += [index[tuple(report["running"])] for report in found if report.get("running")]
    if not stops:  # no pair ran to a verdict or a crash: the processes could not start
        return [*found, {"group": group.name, "task": group.name, "unfinished": log[-2000:], "records": []}], [], None
    stop = min(stops)
    seed, mode = group.work[stop]
    crashed = [(report["task"], r["detail"]) for report in found for r in report["records"]
               if (r["seed"], r["mode"]) == (seed, mode) and r["class"] == "crashed"]
    for report in found:
        report["records"] = [r for r in report["records"] if index.get((r["seed"], r["mode"]), -1) <= stop]
        if not any((r["seed"], r["mode"]) == (seed, mode) for r in report["records"]):
            why = (f"ended with its cluster when {crashed[0][0]} crashed: {crashed[0][1]}" if crashed else
                   f"the process ended during this verdict; its log's last line: {_last_line(log)}")
            report["records"].append({"seed": seed, "mode": mode, "class": "crashed", "detail": why,
                                      **_fresh(group)})
    return found, group.work[stop + 1:], {"seed": seed, "mode": mode}


def _fresh(group: Group) -> dict:
    return {"after_crash": group.after_crash} if group.after_crash else {}


def _last_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(none)"
