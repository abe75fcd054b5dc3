"""tfdist's benchmark (``python -m tfdist.bench``): the plan, its child processes, the measurements and the report."""

from tfdist.bench.plan import jobs_for, rows_for, scaling_rows
from tfdist.bench.report import chart, goals, markdown, render_docs
from tfdist.bench.runner import run_benchmark

__all__ = ["chart", "goals", "jobs_for", "markdown", "render_docs", "rows_for", "run_benchmark", "scaling_rows"]
