"""``run_benchmark``: plan the rows, run their jobs in child processes, then the preemptions, report the medians.

The library side of ``python -m tfdist.bench`` (``__main__``, whose flags it takes as
keyword arguments), so that it can be called without the CLI.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tfdist.bench.report as report
from tfdist.bench.children import launch
from tfdist.bench.plan import jobs_for, plan
from tfdist.bench.preemption import run_all
from tfdist.bench.rows import BASE, Measured

#: Warm-up steps of every throughput row (parameter_server rows warm up one chunk of closures instead).
WARMUP = 4


def run_benchmark(*, quick: bool, steps: int = 0, repeats: int = 0, only: Sequence[str] = (), scaling: bool = True,
                  preemption: bool = True, log: Callable[[str], None] = print) -> dict:
    """Measure every row; returns the JSON-ready results (see ``tfdist.bench.__main__``).

    Args:
      quick: fewer steps and one run of each row (the defaults of ``steps``, ``repeats`` and the scaling rows).
      steps: timed steps per row (0: 16 with ``quick``, else 64).
      repeats: runs of each row, whose median is reported (0: 1 with ``quick``, else 3).
      only: run only these rows (and the baseline); empty: all, scaling included.
      scaling: also measure time per epoch at 1x/2x/4x data and two image sizes.
      preemption: also measure preemption (``tfdist.bench.preemption``; once each, whatever ``repeats`` says).
      log: where progress lines go.

    Raises:
      UserError: ``only`` names a row there is not (or a preemption row without ``preemption``).
      RuntimeError: a row's process failed, or a preemption did not end 42 and resume at its step.
    """
    steps = steps or (16 if quick else 64)
    repeats = repeats or (1 if quick else 3)
    planned = plan(steps=steps, warmup=WARMUP, only=only, scaling_steps=(8 if quick else 16) if scaling else 0,
                   preemption=preemption)
    runs: dict[str, list[Measured]] = {}
    for job in jobs_for(planned.every_row, repeats):
        log(f"bench: {', '.join(dict.fromkeys(r.name for r in job.rows))} ...")
        for result in launch(job):
            runs.setdefault(result.name, []).append(result)
            if result.images_per_second is not None:
                log(f"bench: {result.name}: {result.images_per_second:.1f} images/s ({result.row_seconds:.0f} s)")
    preempted = run_all(planned.preemption, log=log) if planned.preemption else None
    settings = {"quick": quick, "steps": steps, "warmup": WARMUP, "repeats": repeats, **BASE}
    return report.results(planned, runs, settings, preemption=preempted)
