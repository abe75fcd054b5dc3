"""``python -m tfdist.bench``: tfdist's training throughput beside plain Keras, as paired ratios
(the rows, the method and the flags: docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

import tfdist.bench.report as report
from tfdist.bench.measure import run_child
from tfdist.bench.runner import run_benchmark
from tfdist.cli import run_main
from tfdist.errors import UserError, file_in_the_way

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_bool("quick", False, "16 timed steps and one repeat of every row; no time to accuracy and no "
                      "preemption unless asked for.", **fv)
    flags.DEFINE_integer("steps", 0, "Timed steps per row (0: 16 with --quick, else 64).", lower_bound=0, **fv)
    flags.DEFINE_integer("repeats", 0, "Repeats of every row; ratios are paired within a repeat (0: 1 with --quick, "
                         "else 3).", lower_bound=0, **fv)
    flags.DEFINE_string("output", "bench.json", "Where to write the JSON results.", **fv)
    flags.DEFINE_string("markdown", None, "Where to write the Markdown table (default: OUTPUT with .md).", **fv)
    flags.DEFINE_string("chart", None, "Where to write the PNG chart (default: OUTPUT with .png).", **fv)
    flags.DEFINE_list("only", [], "Run only these rows (names as in the table), e.g. keras_fit,one_device.", **fv)
    flags.DEFINE_bool("scaling", True, "Also measure time per epoch at 1x/2x/4x data and two image sizes.", **fv)
    flags.DEFINE_bool("preemption", None, "Also measure preemption (SIGTERM mid-run, exit 42, the relaunch's first "
                      "step), once each for one_device and 2-worker multi_worker_mirrored (default: not with --quick).",
                      **fv)
    flags.DEFINE_bool("time_to_accuracy", None, "Also measure the wall time of the default experiment to eval mean IoU "
                      ">= 0.80, once per strategy (default: not with --quick).", **fv)
    flags.DEFINE_string("render", None, "Only regenerate the `<!-- bench: FILE.json -->` blocks of this Markdown page "
                        "(e.g. docs/benchmarks.md) from their JSON; measures nothing.", **fv)
    flags.DEFINE_string("child", None, "Internal: run these measurements in this process (JSON).", **fv)


def check_output(name: str, path: str | Path) -> None:
    """Refuse an output path that cannot be written: a directory, or a path under a file (before measuring)."""
    path = Path(path)
    above = file_in_the_way(path.parent)
    problem = ("an existing directory" if path.is_dir() else f"under {above}, which is a file" if above else None)
    if problem:
        raise UserError(f"Invalid value for `--{name}`. Received: {str(path)!r}, {problem}. Expected a file path.")


def render(page: Path) -> None:
    """``--render``: rewrite ``page``'s bench blocks from their JSON; what cannot be read is one line."""
    if not page.is_file():
        raise UserError(f"Invalid value for `--render`. Received: {str(page)!r}. Expected a Markdown file.")
    try:
        text = report.render_docs(page, root=Path.cwd())
    except (OSError, ValueError) as e:  # a missing JSON; not UTF-8 (UnicodeDecodeError), not JSON (ValueError)
        raise UserError(f"Cannot render `--render` page {page}: {type(e).__name__}: {' '.join(str(e).split())[:200]}. "
                        "Expected a UTF-8 Markdown page whose bench blocks name JSON results files.") from None
    page.write_text(text)


def main(argv: list[str]) -> int:
    if FLAGS.child:
        run_child(FLAGS.child)
        return 0
    if len(argv) > 1:
        raise UserError(f"Unexpected arguments. Received: {' '.join(argv[1:])}. Expected only --flags.")
    if FLAGS.render:
        render(Path(FLAGS.render))
        return 0
    output = Path(FLAGS.output)
    for name, path in (("output", output), ("markdown", FLAGS.markdown or output.with_suffix(".md")),
                       ("chart", FLAGS.chart or output.with_suffix(".png"))):
        check_output(name, path)
    results = run_benchmark(quick=FLAGS.quick, steps=FLAGS.steps, repeats=FLAGS.repeats, only=FLAGS.only,
                            scaling=FLAGS.scaling, accuracy=FLAGS.time_to_accuracy, preemption=FLAGS.preemption,
                            log=lambda m: print(m, flush=True))
    print(report.write(results, output=Path(FLAGS.output), markdown_path=FLAGS.markdown, chart_path=FLAGS.chart))
    return 0


def entry() -> None:
    """The CLI: flags, then ``main``; user errors end with one line and status 2 (``cli.run_main``)."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
