"""Time to accuracy: wall seconds from the start of a real ``tfdist.train`` run to its first eval with
mean IoU >= 0.80, polled from its ``metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tfdist.bench.children import POLL_SECONDS, Process, rows, train_command

#: The accuracy every row must reach: eval mean IoU of the default experiment.
TARGET = 0.80


@dataclasses.dataclass(frozen=True, kw_only=True)
class AccuracySpec:
    """One time-to-accuracy measurement.

    Attributes:
      name: its name in the table (and in ``--only``).
      strategy: the tfdist strategy.
      cluster: task counts for the launcher (e.g. ``{"worker": 2}``), or None for one process.
      flags: more ``python -m tfdist.train`` flags (e.g. ``--norm=group``); the experiment is the default.
      target: the eval mean IoU to reach.
      full_budget: run to the end of the experiment instead of stopping at the target.
      timeout: the bound on the whole run, in seconds.
    """

    name: str
    strategy: str
    cluster: Mapping[str, int] | None = None
    flags: tuple[str, ...] = ()
    target: float = TARGET
    full_budget: bool = False
    timeout: float = 900.0


def accuracy_specs() -> list[AccuracySpec]:
    """one_device, mirrored, 2-worker multi_worker_mirrored (with each normalization) and parameter_server."""
    def two_workers(suffix: str = "", *flags: str) -> AccuracySpec:
        return AccuracySpec(name=f"accuracy_multi_worker_mirrored_2{suffix}", strategy="multi_worker_mirrored",
                            cluster={"worker": 2}, flags=flags, full_budget=True)

    return [AccuracySpec(name="accuracy_one_device", strategy="one_device"),
            AccuracySpec(name="accuracy_mirrored", strategy="mirrored"),
            two_workers(),
            two_workers("_group_norm", "--norm=group"),
            two_workers("_replica_batch_norm", "--norm=replica_batch"),
            AccuracySpec(name="accuracy_parameter_server_2", strategy="parameter_server",
                         cluster={"chief": 1, "worker": 2, "ps": 1})]


def measure(spec: AccuracySpec) -> dict[str, Any]:
    """Run ``spec`` until an eval reaches its target (then SIGTERM), or to its end; returns its figures.

    Returns: ``{"name", "strategy", "flags", "target", "reached", "seconds_to_target", "step", "evals":
    [[seconds, step, mean_iou], ...], "status", "row_seconds"}`` (``seconds_to_target`` and ``step`` None when
    never reached).

    Raises:
      RuntimeError: the run failed (a status other than 0, or 42 after our SIGTERM), or ran past ``timeout``.
    """
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-accuracy-") as tmp:
        directory = Path(tmp)
        flags = [f"--strategy={spec.strategy}", f"--model_dir={directory / 'run'}", "--noexport", *spec.flags]
        argv = train_command(flags, directory, spec.cluster)
        metrics = directory / "run" / "metrics.jsonl"
        proc = Process(argv, directory, "run", label="accuracy benchmark")
        seen: list[list[float]] = []
        reached = None
        try:
            deadline = time.monotonic() + spec.timeout
            while (reached is None or spec.full_budget) and proc.popen.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"accuracy benchmark: {spec.name} still running after {spec.timeout:g} s: "
                                       f"{proc.text()[-1500:]}")
                for row in rows(metrics, "eval")[len(seen):]:
                    seen.append([time.time() - proc.started_at, row["step"], row["mean_iou"]])
                    if row["mean_iou"] >= spec.target and reached is None:
                        reached = seen[-1]
                time.sleep(POLL_SECONDS)
            if reached is not None and not spec.full_budget and proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
            status = proc.wait(120, "exit")
            for row in rows(metrics, "eval")[len(seen):]:  # written as it ended
                seen.append([time.time() - proc.started_at, row["step"], row["mean_iou"]])
                reached = reached or (seen[-1] if row["mean_iou"] >= spec.target else None)
            if status not in (0, 42) or (status == 42 and reached is None):
                raise RuntimeError(f"accuracy benchmark: {spec.name} ended with status {status}: "
                                   f"{proc.text()[-1500:]}")
        finally:
            proc.kill()
    return {"name": spec.name, "strategy": spec.strategy, "flags": list(spec.flags), "target": spec.target,
            "reached": reached is not None, "seconds_to_target": reached[0] if reached else None,
            "step": reached[1] if reached else None, "evals": seen, "status": status,
            "row_seconds": time.monotonic() - began}


def run_all(specs: Sequence[AccuracySpec], log: Callable[[str], None] = print) -> dict:
    """Each spec measured once, in order; the ``"accuracy"`` part of the results JSON."""
    measured = []
    for spec in specs:
        log(f"bench: {spec.name} ...")
        row = measure(spec)
        last = row["evals"][-1][2] if row["evals"] else float("nan")
        log(f"bench: {spec.name}: " + (f"mean IoU >= {spec.target} after {row['seconds_to_target']:.0f} s (step "
                                       f"{row['step']})" if row["reached"] else f"never reached, last {last:.3f}"))
        measured.append(row)
    return {"runs": 1, "target": TARGET, "rows": measured}


def markdown(section: Mapping[str, Any]) -> list[str]:
    """The ``"accuracy"`` part as Markdown lines."""
    lines = [f"| time to accuracy | s to mean IoU >= {section['target']:.2f} | step | last eval: mean IoU (s, step) | "
             "mean IoU of each eval (s) |", "|---|---:|---:|---|---|"]
    for r in section["rows"]:
        curve = ", ".join(f"{iou:.2f} ({s:.0f})" for s, _, iou in r["evals"])
        seconds = f"{r['seconds_to_target']:.0f}" if r["reached"] else "not reached"
        last = r["evals"][-1] if r["evals"] else None
        end = f"{last[2]:.3f} ({last[0]:.0f} s, step {last[1]})" if last else ""
        lines.append(f"| {r['name']} | {seconds} | {r['step'] if r['reached'] else ''} | {end} | {curve} |")
    return lines
