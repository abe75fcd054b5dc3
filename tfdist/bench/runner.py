"""``run_benchmark``: the library side of ``python -m tfdist.bench``: plan, child processes, the parent's own
runs, then the report with the machine and versions it was measured on.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

import tfdist.bench.report as report
from tfdist.bench import accuracy as accuracy_lib
from tfdist.bench import preemption as preemption_lib
from tfdist.bench.children import launch
from tfdist.bench.plan import jobs_for, plan
from tfdist.bench.rows import BASE, Measured

#: Warm-up steps of every throughput row, Keras' and tfdist's alike (parameter_server rows: one chunk of closures).
WARMUP = 4


def versions() -> dict[str, str]:
    """Python and the installed TensorFlow, Keras and tfdist (package metadata: TensorFlow is not imported)."""
    out = {"python": platform.python_version()}
    for name, dist in (("tensorflow", "tensorflow"), ("keras", "keras"), ("tfdist", "tfdist")):
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine() -> dict:
    """This machine: CPU model and count, memory, GPUs (``nvidia-smi -L``'s count where there is one), date."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError):
        memory_gb = None
    gpus = len(list(Path("/dev").glob("nvidia[0-9]*")))
    return {"cpu_model": model, "cpus": os.cpu_count(), "memory_gb": memory_gb, "gpus": gpus or "no",
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:]}


def run_benchmark(*, quick: bool, steps: int = 0, repeats: int = 0, only: Sequence[str] = (), scaling: bool = True,
                  accuracy: bool | None = None, preemption: bool | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Measure every row; returns the JSON-ready results (see ``tfdist.bench.cli``).

    Args:
      quick: fewer steps and one repeat (the defaults of ``steps``, ``repeats`` and the scaling rows); time to
        accuracy and preemption are off unless asked for.
      steps: timed steps per row (0: 16 with ``quick``, else 64).
      repeats: repeats of every row, each ratio paired within one (0: 1 with ``quick``, else 3).
      only: run only these rows (and the rows their ratios need); empty: all, scaling included.
      scaling: also measure time per epoch at 1x/2x/4x data and two image sizes.
      accuracy: also measure time to accuracy (None: not with ``quick``, else yes).
      preemption: also measure preemption (None: not with ``quick``, else yes).
      log: where progress lines go.

    Raises:
      UserError: ``only`` names a row there is not (or a measurement whose flag is off).
      RuntimeError: a row's process failed, or a parent's run did not end as it must.
    """
    began = time.monotonic()
    steps = steps or (16 if quick else 64)
    repeats = repeats or (1 if quick else 3)
    accuracy = (not quick) if accuracy is None else accuracy
    preemption = (not quick) if preemption is None else preemption
    planned = plan(steps=steps, warmup=WARMUP, only=only, scaling_steps=(8 if quick else 16) if scaling else 0,
                   accuracy=accuracy, preemption=preemption)
    runs: dict[str, list[Measured]] = {}
    for job in jobs_for(planned.every_row, repeats):
        log(f"bench: {', '.join(r.name for r in job.rows)} (repeat {job.repeat + 1}) ...")
        for result in launch(job, log=log):
            runs.setdefault(result.name, []).append(result)
            if result.images_per_second is not None:
                log(f"bench: {result.name}: {result.images_per_second:.1f} images/s ({result.row_seconds:.0f} s)")
    accuracies = accuracy_lib.run_all(planned.accuracy, log=log) if planned.accuracy else None
    preempted = preemption_lib.run_all(planned.preemption, log=log) if planned.preemption else None
    settings = {"quick": quick, "steps": steps, "warmup": WARMUP, "repeats": repeats, **BASE}
    out = report.results(planned, runs, settings, accuracy=accuracies, preemption=preempted)
    return {"machine": {**machine(), "wall_seconds": time.monotonic() - began}, "versions": versions(), **out}
