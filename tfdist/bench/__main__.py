"""``python -m tfdist.bench``: tfdist's training throughput beside plain Keras, as ratios.

Every row trains the same UNet, global batch and shapes data (generated,
held in memory, no augmentation: the same images Keras gets):

- ``keras_fit``: the baseline, plain ``model.fit`` on one device, written as a
  user would write it (``compile("adam", ...)`` with Keras' defaults; on a
  CPU-only host Keras' ``jit_compile="auto"`` means no XLA, and tfdist's
  default is no XLA too);
- tfdist ``one_device``, ``mirrored`` x1/x2, ``central_storage`` x2,
  ``multi_worker_mirrored`` with 1 and 2 worker processes (gRPC on
  127.0.0.1), ``parameter_server`` with 1 and 2 workers (an in-process cluster
  of real gRPC servers), each with tfdist's defaults;
- the input pipeline against cached tensors (the same steps fed from
  ``take(n).cache().repeat()`` of already-built batches);
- the all-reduce time of the model's gradients under 2-worker
  ``multi_worker_mirrored`` and its share of a step;
- time from process start to the first finished step, and peak memory (RSS)
  of each row;
- scaling: time per epoch at 1x, 2x and 4x the dataset and at two image sizes;
- preemption (``tfdist.bench.preemption``), ``one_device`` and 2-worker
  ``multi_worker_mirrored`` under ``python -m tfdist.launch --local``: seconds
  from SIGTERM mid-run to the exit with status 42, from the relaunch to its
  first step beside the fresh start's (their ratio is the resume's extra
  cost), and the step reached against the step resumed at; once each.

Rows that need the same process set-up share one process (start-up is most
of a short row's time): the one-logical-CPU rows (``keras_fit``,
``one_device``, ``mirrored_1``, the input pipeline, scaling) and the
two-logical-CPU rows (``mirrored_2``, ``central_storage_2``); each runs its
rows one after another, ``--repeats`` times interleaved, so a slow moment of
the machine hits every row alike. Rows with a cluster (collectives, gRPC
servers) get fresh processes per run, since a cluster cannot be torn down.
A row's peak memory is the process's high-water mark reset at the row's start
(Linux ``clear_refs``); its time to first step is the process's start-up
(imports) plus the row's own build, trace and first step.

Throughput is images per second after warm-up: Keras within its second
epoch, after that epoch's first step (Keras' array adapter spends about 1 s
at each epoch boundary here, which the baseline leaves out: the strictest
baseline for tfdist), tfdist after its first loop call (which traces).
``--repeats N`` runs each row N times and reports the median (the
preemption rows run once). ``--only`` names rows, the preemption rows
(``preemption_one_device``, ``preemption_multi_worker_mirrored_2``) among
them; ``--noscaling`` and ``--nopreemption`` skip those parts. Output:
``--output FILE.json`` with ``{"baseline": {...}, "rows": [{"name",
"images_per_second", "ratio", ...}], "preemption": {"runs", "rows": [...]}}``,
Markdown tables (``--markdown``, default beside the JSON) and a PNG chart
(``--chart``).
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

import tfdist.bench.tables as tables
from tfdist.bench.measure import run_child
from tfdist.bench.runner import run_benchmark
from tfdist.errors import UserError, run_main

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_bool("quick", False, "Fewer steps and one run of each row: about 7.5 minutes on 2 cores "
                      "(3 of them the preemption rows).")
    flags.DEFINE_integer("steps", 0, "Timed steps per row (0: 16 with --quick, else 64).")
    flags.DEFINE_integer("repeats", 0, "Runs of each row; the median is reported (0: 1 with --quick, else 3).")
    flags.DEFINE_string("output", "bench.json", "Where to write the JSON results.")
    flags.DEFINE_string("markdown", None, "Where to write the Markdown table (default: OUTPUT with .md).")
    flags.DEFINE_string("chart", None, "Where to write the PNG chart (default: OUTPUT with .png).")
    flags.DEFINE_list("only", [], "Run only these rows (names as in the table), e.g. keras_fit,one_device.")
    flags.DEFINE_bool("scaling", True, "Also measure time per epoch at 1x/2x/4x data and two image sizes.")
    flags.DEFINE_bool("preemption", None, "Also measure preemption (SIGTERM mid-run, exit 42, the relaunch's first "
                      "step), once each for one_device and 2-worker multi_worker_mirrored (default: not with --quick).")
    flags.DEFINE_bool("time_to_accuracy", None, "Also measure the wall time of the default experiment to eval mean IoU "
                      ">= 0.80, once per strategy (default: not with --quick).")
    flags.DEFINE_string("render", None, "Only regenerate the `<!-- bench: FILE.json -->` blocks of this Markdown page "
                        "(e.g. docs/benchmarks.md) from their JSON; measures nothing.")
    flags.DEFINE_string("child", None, "Internal: run these measurements in this process (JSON).")


def main(argv: list[str]) -> int:
    if FLAGS.child:
        run_child(FLAGS.child)
        return 0
    if len(argv) > 1:
        raise UserError(f"Unexpected arguments. Received: {' '.join(argv[1:])}. Expected only --flags.")
    if FLAGS.render:
        page = Path(FLAGS.render)
        if not page.is_file():
            raise UserError(f"Invalid value for `--render`. Received: {FLAGS.render}. Expected a Markdown file.")
        page.write_text(tables.render_docs(page, root=Path.cwd()))
        return 0
    results = run_benchmark(quick=FLAGS.quick, steps=FLAGS.steps, repeats=FLAGS.repeats, only=FLAGS.only,
                            scaling=FLAGS.scaling, accuracy=FLAGS.time_to_accuracy, preemption=FLAGS.preemption,
                            log=lambda m: print(m, flush=True))
    print(tables.write(results, output=Path(FLAGS.output), markdown_path=FLAGS.markdown, chart_path=FLAGS.chart))
    return 0


def entry() -> None:
    """The CLI: flags, then ``main``; user errors end with one line and status 2 (``errors.run_main``)."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
