"""Preemption as a benchmark measurement: a SIGTERM mid-run to real ``tfdist.train`` processes, the exit 42,
and the relaunch that resumes at the step reached.

A fast run would finish before its signal, so the preempted run holds after a chosen step until it has received
it: ``python -m tfdist.bench.preemption FLAGS`` is ``tfdist.train``'s command with the hold's hook, which the
environment (``hold_env``) asks for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tfdist.bench.rows import BASE
from tfdist.bench.children import POLL_SECONDS, Process, train_command
from tfdist.cluster.task import slug_of
from tfdist.engine.plan import Hook
from tfdist.errors import DONE_EXIT_CODE, PREEMPTED_EXIT_CODE, RunFailed

#: ``error: Preempted at step N of M`` (each task's, prefixed ``[worker:i] `` under the launcher).
PREEMPTED_LINE = re.compile(r"error: Preempted at step (\d+) of (\d+)")
#: The relaunch's ``tfdist: ... ; resuming from <path> at step N`` line.
RESUMED_LINE = re.compile(r"resuming from (\S+) at step (\d+)")


#: The step after which each task of the preempted run holds; unset or empty: no hold.
STEP_VARIABLE = "TFDIST_HOLD_AT_STEP"
#: The directory that gets one marker file per holding task.
DIRECTORY_VARIABLE = "TFDIST_HOLD_DIR"
#: The bound of the wait, in seconds.
SECONDS_VARIABLE = "TFDIST_HOLD_SECONDS"
#: How often a holding task looks whether its signal arrived.
HOLD_POLL_SECONDS = 0.005
#: The module the preempted run is started as: ``tfdist.train``'s command with the hold (this one).
HELD_MODULE = "tfdist.bench.preemption"


def marker_name(task: str) -> str:
    """The marker file of ``task`` (``"worker:1"`` -> ``"worker-1.held"``)."""
    return slug_of(task) + ".held"


def hold_for_signal(begin: int, end: int, preemption, first_step_at: float | None) -> None:
    """If ``TFDIST_HOLD_AT_STEP`` lies in ``(begin, end]``: mark this task as held, wait for its signal.

    The marker (JSON: task, step, when its first step ended) goes into
    ``TFDIST_HOLD_DIR``; the wait lasts at most ``TFDIST_HOLD_SECONDS``. The
    next chunk then carries the task's vote to stop.

    Args:
      begin, end: the chunk of steps just trained.
      preemption: this task's ``runtime.preemption.Preemption`` (None: it takes no signal; the hold fails).
      first_step_at: unix time this task's first chunk ended, written into the marker.

    Raises:
      RunFailed: no signal within ``TFDIST_HOLD_SECONDS``, or the run takes no preemption signal.
    """
    at = os.environ.get(STEP_VARIABLE, "")
    if not at or not begin < int(at) <= end:
        return
    seconds = float(os.environ.get(SECONDS_VARIABLE, "60"))
    if preemption is None:
        raise RunFailed(f"{STEP_VARIABLE}={at} asks this task to hold for a signal, but its run takes no "
                        "preemption signal. Expected a run of tfdist.train, which takes SIGTERM.")
    where = preemption.where
    marker = Path(os.environ[DIRECTORY_VARIABLE]) / marker_name(where)
    partial = marker.with_suffix(".partial")
    partial.write_text(json.dumps({"task": where, "step": end, "first_step_at": first_step_at}))
    partial.replace(marker)  # whole or absent for a reader
    deadline = time.monotonic() + seconds
    while not preemption.requested:
        if time.monotonic() > deadline:
            raise RunFailed(f"{where} held after step {end} ({STEP_VARIABLE}={at}) for {seconds:g} s and "
                            "received no SIGTERM or SIGUSR1. Expected the process that set the hold to signal it.")
        time.sleep(HOLD_POLL_SECONDS)


class HoldForSignal(Hook):
    """The hold as an engine hook: after each chunk's log row and checkpoint, ``hold_for_signal``."""

    def chunk_done(self, step: int, end: int, controller) -> None:
        hold_for_signal(step, end, controller.preemption, controller.first_step_at)


def hold_from_environment() -> tuple[Hook, ...]:
    """The hold's hook when ``TFDIST_HOLD_AT_STEP`` asks for one; else none."""
    return (HoldForSignal(),) if os.environ.get(STEP_VARIABLE, "") else ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreemptionSpec:
    """One preemption measurement.

    Attributes:
      name: its name in the table (and in ``--only``).
      strategy: the tfdist strategy.
      workers: 1: one ``python -m tfdist.train`` process; more: that many
        ``multi_worker_mirrored`` workers under ``python -m tfdist.launch --local``.
      steps: the run's steps (one epoch), enough that the signal lands mid-run.
      signal_at: every task holds after this step until the SIGTERM; the run stops after the next one.
      overrides: experiment values over ``BASE`` (the test's tiny model).
      timeout: the bound of each wait (the hold, exit, relaunch), in seconds.
    """

    name: str
    strategy: str
    workers: int = 1
    steps: int = 24
    signal_at: int = 8
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timeout: float = 300.0

    def train_flags(self, model_dir: Path) -> list[str]:
        """``python -m tfdist.train`` flags: ``BASE`` (with overrides), one epoch of ``steps``, a row every step."""
        values = {**BASE, **self.overrides, "strategy": self.strategy, "epochs": 1, "steps_per_epoch": self.steps,
                  "log_every": 1, "model_dir": str(model_dir)}
        return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def preemption_specs() -> list[PreemptionSpec]:
    """Every preemption measurement of the benchmark: one process, and 2 workers under the launcher."""
    return [PreemptionSpec(name="preemption_one_device", strategy="one_device"),
            PreemptionSpec(name="preemption_multi_worker_mirrored_2", strategy="multi_worker_mirrored", workers=2)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreemptionMeasured:
    """One preemption measurement's figures.

    Attributes:
      name, strategy, workers, steps, signal_at: as in the spec.
      exit_seconds: SIGTERM to the exit of the process (or the launcher) with status 42.
      fresh_first_step_seconds: fresh start (process start) to its first finished step.
      resumed_first_step_seconds: relaunch (process start) to its first finished step.
      resume_ratio: ``resumed_first_step_seconds / fresh_first_step_seconds``: the resume's extra cost.
      reached_step: the step the preempted run saved (its ``error: Preempted at step N`` line).
      resumed_step: the step the relaunch resumed at (``summary.json``'s ``start_step``).
      statuses: the exit statuses of the preempted run and of the relaunch (42, 0).
      row_seconds: the measurement's wall time (both runs).
    """

    name: str
    strategy: str
    workers: int
    steps: int
    signal_at: int
    exit_seconds: float
    fresh_first_step_seconds: float
    resumed_first_step_seconds: float
    resume_ratio: float
    reached_step: int
    resumed_step: int
    statuses: tuple[int, int]
    row_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The figures, in field order (the JSON's)."""
        return dataclasses.asdict(self)


def command(spec: PreemptionSpec, directory: Path) -> list[str]:
    """The run's command line: the train CLI with the hold (``HELD_MODULE``), under the launcher (a cluster file on
    free ports) for workers > 1."""
    return train_command(spec.train_flags(directory / "run"), directory,
                         {"worker": spec.workers} if spec.workers > 1 else None, module=HELD_MODULE)


def hold_env(spec: PreemptionSpec, directory: Path) -> dict[str, str]:
    """The environment that makes every task of the run hold after ``spec.signal_at`` (markers into ``directory``)."""
    return {STEP_VARIABLE: str(spec.signal_at), DIRECTORY_VARIABLE: str(directory),
            SECONDS_VARIABLE: f"{spec.timeout:g}"}


def _wait_for_hold(proc: Process, directory: Path, spec: PreemptionSpec) -> float:
    """Wait until every task holds (its marker in ``directory``); returns the earliest task's ``first_step_at``."""
    deadline = time.monotonic() + spec.timeout
    while time.monotonic() < deadline:
        markers = sorted(directory.glob("*.held"))
        if len(markers) == spec.workers:
            marks = [json.loads(m.read_text()) for m in markers]
            if any(m["step"] != spec.signal_at for m in marks):
                raise RuntimeError(f"preemption benchmark: expected every task to hold after step {spec.signal_at}, "
                                   f"received {marks}")
            return min(m["first_step_at"] for m in marks)
        if proc.popen.poll() is not None:
            raise RuntimeError(f"preemption benchmark: the run ended (status {proc.popen.returncode}) before "
                               f"{spec.workers} task(s) held after step {spec.signal_at}: {proc.text()[-1500:]}")
        time.sleep(POLL_SECONDS)
    raise RuntimeError(f"preemption benchmark: {len(list(directory.glob('*.held')))} of {spec.workers} task(s) "
                       f"held after step {spec.signal_at} within {spec.timeout:g} s: {proc.text()[-1500:]}")


def _expect(status: int, expected: int, what: str, proc: Process) -> None:
    if status != expected:
        raise RuntimeError(f"preemption benchmark: {what} ended with status {status}, expected {expected}: "
                           f"{proc.text()[-1500:]}")


def _reached_step(text: str, spec: PreemptionSpec) -> int:
    """The step every task of the preempted run saved; one step for all (synchronous), else it raises."""
    steps = {int(m.group(1)) for m in PREEMPTED_LINE.finditer(text)}
    count = len(PREEMPTED_LINE.findall(text))
    if len(steps) != 1 or count != spec.workers:
        raise RuntimeError(f"preemption benchmark: expected {spec.workers} `error: Preempted at step N` line(s) "
                           f"with one N, received steps {sorted(steps)} in {count} line(s): {text[-1500:]}")
    return steps.pop()


def measure(spec: PreemptionSpec) -> PreemptionMeasured:
    """Preempt a fresh run of ``spec`` with SIGTERM mid-run, relaunch it, and time both (see the module docstring).

    Raises:
      RuntimeError: a status other than 42 then 0, no resume, a resumed step other than the step reached,
        or a wait past ``spec.timeout``.
    """
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-preemption-") as tmp:
        directory = Path(tmp)
        argv = command(spec, directory)
        summary, held = directory / "run" / "summary.json", directory / "held"
        held.mkdir()
        started: list[Process] = []
        try:
            started.append(fresh := Process(argv, directory, "fresh", env=hold_env(spec, held)))
            first_step_at = _wait_for_hold(fresh, held, spec)
            sent = time.monotonic()  # after the hold: the figure is the stop's alone
            fresh.popen.send_signal(signal.SIGTERM)
            status = fresh.wait(spec.timeout, "exit after SIGTERM")
            exit_seconds = time.monotonic() - sent
            _expect(status, PREEMPTED_EXIT_CODE, "the preempted run", fresh)
            reached = _reached_step(fresh.text(), spec)
            if reached != spec.signal_at + 1 or reached >= spec.steps:
                raise RuntimeError(f"preemption benchmark: preempted at step {reached}, expected the step after the "
                                   f"hold ({spec.signal_at + 1}), before the last ({spec.steps}; raise `steps` "
                                   "above `signal_at` + 1 if it is not).")
            started.append(again := Process(argv, directory, "relaunch"))
            again_status = again.wait(spec.timeout, "end of the relaunch")
            _expect(again_status, DONE_EXIT_CODE, "the relaunch", again)
            resumed_line = RESUMED_LINE.search(again.text())
            result = json.loads(summary.read_text())
        finally:
            for proc in started:
                proc.kill()
    resumed = result["start_step"]
    if resumed_line is None or int(resumed_line.group(2)) != resumed or resumed != reached:
        raise RuntimeError(f"preemption benchmark: preempted at step {reached}, but the relaunch resumed at "
                           f"step {resumed} ({resumed_line.group(0) if resumed_line else 'no resuming line'}); "
                           "a synchronous strategy must resume at the step it reached.")
    fresh_seconds = first_step_at - fresh.started_at
    resumed_seconds = result["first_step_at"] - again.started_at
    return PreemptionMeasured(name=spec.name, strategy=spec.strategy, workers=spec.workers, steps=spec.steps,
                              signal_at=spec.signal_at,
                              exit_seconds=exit_seconds, fresh_first_step_seconds=fresh_seconds,
                              resumed_first_step_seconds=resumed_seconds, resume_ratio=resumed_seconds / fresh_seconds,
                              reached_step=reached, resumed_step=resumed, statuses=(status, again_status),
                              row_seconds=time.monotonic() - began)


def run_all(specs: Sequence[PreemptionSpec], log: Callable[[str], None] = print) -> dict:
    """Each spec measured once, in order (not repeated: see the module docstring).

    Returns the ``"preemption"`` part of the results JSON: ``{"runs": 1, "rows": [{"name", ...}]}``.
    """
    rows = []
    for spec in specs:
        log(f"bench: {spec.name} ...")
        m = measure(spec)
        log(f"bench: {spec.name}: exit {m.exit_seconds:.1f} s, first step {m.fresh_first_step_seconds:.1f} s "
            f"fresh, {m.resumed_first_step_seconds:.1f} s resumed ({m.resume_ratio:.2f}x), step "
            f"{m.reached_step} -> {m.resumed_step} ({m.row_seconds:.0f} s)")
        rows.append(m.to_dict())
    return {"runs": 1, "rows": rows}


def markdown(section: Mapping[str, Any]) -> list[str]:
    """The ``"preemption"`` part of the results as Markdown lines: a table, and how each row was measured."""
    lines = ["| preemption | s SIGTERM to exit 42 | s to first step, fresh | s to first step, resumed | "
             "resumed / fresh | step reached | resumed at |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in section["rows"]:
        lines.append(f"| {r['name']} | {r['exit_seconds']:.1f} | {r['fresh_first_step_seconds']:.1f} | "
                     f"{r['resumed_first_step_seconds']:.1f} | {r['resume_ratio']:.2f} | {r['reached_step']} | "
                     f"{r['resumed_step']} |")
    when = sorted({(r["signal_at"], r["steps"]) for r in section["rows"]})
    runs = "One run of each preemption row" if section["runs"] == 1 else f"{section['runs']} runs of each"
    lines += ["", f"{runs} (not repeated): SIGTERM after step " + " / ".join(f"{k} of {n}" for k, n in when)
              + ", then the same command again."]
    return lines


if __name__ == "__main__":
    from tfdist.segmentation import command as train_cli

    train_cli.entry(hooks=hold_from_environment())
