"""tfdist's benchmark, ``python -m tfdist.bench``: what it measures and how is in ``__main__``'s docstring.

The package, by idea: ``rows`` (the typed rows, jobs and results),
``plan`` (which rows, in which processes), ``children`` (starting and
reading the measuring processes), ``measure`` (what a child runs),
``preemption`` (SIGTERM mid-run and the relaunch, as real train and launcher
processes), ``fit_profile`` (``tfdist.fit`` against Keras' ``fit`` in one
process, wall and CPU time), ``report`` (medians, ratios, goals, JSON, Markdown, PNG), ``runner``
(``run_benchmark``: plan, children and report in order) and ``__main__``
(the thin absl CLI; ``--child JOB`` is how the parent starts each child).
"""

from tfdist.bench.plan import jobs_for, rows_for, scaling_rows
from tfdist.bench.report import goals
from tfdist.bench.tables import chart, markdown, render_docs
from tfdist.bench.runner import run_benchmark

__all__ = ["chart", "goals", "jobs_for", "markdown", "render_docs", "rows_for", "run_benchmark", "scaling_rows"]
