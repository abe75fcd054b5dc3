"""``python -m tfdist.check``: Keras training setups drawn from a seeded space, each trained in every mode and
compared with Keras' own one-device ``fit`` on every worker (the space, the modes and the classes: docs/fit.md).
"""

from __future__ import annotations

import collections
import json
import signal
import sys
import tempfile
from pathlib import Path

from absl import flags

from tfdist.check import runs, space, verdict
from tfdist.check.groups import run_groups
from tfdist.check.user import check_name
from tfdist.cli import only_flags, require_finite, run_main
from tfdist.errors import UserError, special_file, unwritable_file

FLAGS = flags.FLAGS

#: The modes a check runs unless ``--modes`` names others: every synchronous one.
DEFAULT_MODES = tuple(name for name, mode in runs.MODES.items() if not mode.asynchronous)


#: The most cases one run draws (each runs in every mode: a run of more would not end).
MAX_CASES = 100_000


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_integer("cases", 20, "Cases to draw from the space.", lower_bound=1, upper_bound=MAX_CASES, **fv)
    flags.DEFINE_integer("seed", 0, "The run's seed: the same seed draws the same cases.", lower_bound=0, **fv)
    flags.DEFINE_list("case", [], "Run exactly these cases (each the seed a report prints), instead of drawing.", **fv)
    flags.DEFINE_string("model", None, "Check your own setup instead of drawn cases: MODULE:FUNCTION (or "
                        "path/to/file.py:FUNCTION) of a function returning (model_fn, x, y, fit_kwargs).", **fv)
    flags.DEFINE_list("modes", list(DEFAULT_MODES), f"Modes to run, of {', '.join(runs.MODES)}.", **fv)
    flags.DEFINE_string("output", None, "Where to write every verdict as JSON (default: none).", **fv)
    flags.DEFINE_string("markdown", None, "Where to write the matrix of families (Markdown; default: none).", **fv)
    flags.DEFINE_string("matrix", None, "Where to write the matrix of families as JSON, with the command that made "
                        "it (docs/check-matrix.json is one; default: none).", **fv)
    flags.DEFINE_string("page", None, "A Markdown page whose `<!-- check-matrix -->` block this run's matrix "
                        "replaces, with the command that made it (docs/fit.md's; default: none).", **fv)
    flags.DEFINE_float("timeout", 3600.0, "Seconds the groups of processes may run (side by side).",
                       lower_bound=1.0, **fv)
    require_finite("timeout", flag_values=flag_values)


def _seeds() -> list[int]:
    if not FLAGS.case:
        return space.seeds(FLAGS.cases, FLAGS.seed)
    bad = [c for c in FLAGS.case if not (c.isascii() and c.isdigit())]
    if bad:
        raise UserError(f"Invalid value for `--case`. Received: {','.join(FLAGS.case)}. Expected case seeds, "
                        "non-negative integers as a report prints them.")
    return list(dict.fromkeys(int(c) for c in FLAGS.case))


def _modes() -> list[str]:
    unknown = [m for m in FLAGS.modes if m not in runs.MODES]
    if unknown or not FLAGS.modes:
        raise UserError(f"Invalid value for `--modes`. Received: {','.join(FLAGS.modes)!r}. Expected one or more "
                        f"of {', '.join(runs.MODES)}.")
    return list(dict.fromkeys(FLAGS.modes))


def fresh_lines(records: list[dict]) -> list[str]:
    """One line for each crash after which a group's processes were restarted: the verdicts of the fresh ones."""
    after = collections.defaultdict(list)
    for record in records:
        if record.get("after_crash"):
            crash = record["after_crash"]
            after[(crash["seed"], crash["mode"])].append(record)
    lines = []
    for (seed, mode), found in after.items():
        ran = dict.fromkeys(f"{r['seed']} in {r['mode']}" for r in found)
        lines.append(f"restarted after case {seed} crashed in {mode}: {len(found)} verdicts of its processes ran in "
                     f"fresh ones (case {', case '.join(ran)})")
    return lines


def cells(cases: dict[int, space.Case], records: list[dict]) -> list[list]:
    """The matrix of a run as data: ``[family, value, mode, {class: cases}]`` for each family's value and mode."""
    counts = collections.defaultdict(collections.Counter)
    for record in records:
        case = cases.get(record["seed"])
        if case is None:
            continue
        for family, values in case.families().items():
            for value in values:
                counts[(family, value, record["mode"])][record["class"]] += 1
    return [[f, v, m, dict(sorted(c.items()))] for (f, v, m), c in
            sorted(counts.items(), key=lambda item: (space.FAMILIES.index(item[0][0]), item[0][1], item[0][2]))]


def render(matrix: list[list], modes: list[str]) -> str:
    """The Markdown table of a matrix: one row per family's value, in each mode the classes of its cases."""
    by_row = collections.defaultdict(dict)
    for family, value, mode, classes in matrix:
        by_row[(family, value)][mode] = classes
    lines = ["| family | value | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
    for (family, value), row in by_row.items():
        text = [", ".join(f"{n} {c}" for c, n in row[m].items()) if m in row else "–" for m in modes]
        lines.append(f"| {family} | {value} | " + " | ".join(text) + " |")
    return "\n".join(lines)


#: The flags that say where results go: a matrix's command leaves them out (they change no verdict).
OUTPUTS = ("output", "markdown", "matrix", "page")


def run_command(argv: list[str]) -> str:
    """The command that repeats a run: ``python -m tfdist.check`` and its flags but those of ``OUTPUTS``."""
    kept, skip = [], False
    for arg in argv:
        name = arg.lstrip("-").split("=", 1)[0]
        if skip:
            skip = False
        elif arg.startswith("-") and name in OUTPUTS:
            skip = "=" not in arg
        else:
            kept.append(arg)
    return " ".join(["python -m tfdist.check", *kept])


#: The markers of a page's generated matrix.
BEGIN, END = "<!-- check-matrix -->", "<!-- /check-matrix -->"


def page_block(report: dict) -> str:
    """The text between a page's markers: the command, the cases and the matrix of a run's JSON report."""
    return (f"Measured by `{report['command']}` ({report['cases']} cases):\n\n"
            + render(report["cells"], report["modes"]))


def check_outputs() -> None:
    """Refuse, before any case runs, an output path that cannot be written and a page without the markers."""
    for name in OUTPUTS:
        value = getattr(FLAGS, name)
        if value and (Path(value).is_dir() or not Path(value).parent.is_dir()):
            raise UserError(f"Invalid value for `--{name}`. Received: {value!r}, a directory or a path whose "
                            "folder does not exist. Expected a file path in an existing folder.")
        problem = value and (special_file(value) or unwritable_file(value))
        if problem:
            raise UserError(f"Invalid value for `--{name}`: it cannot be written ({problem}). Received: {value!r}. "
                            "Expected a writable file path.")
    if FLAGS.page:
        text = Path(FLAGS.page).read_text(errors="replace") if Path(FLAGS.page).is_file() else ""
        if BEGIN not in text or END not in text:
            raise UserError(f"Invalid value for `--page`. Received: {FLAGS.page!r}, without the lines {BEGIN} and "
                            f"{END}. Expected a Markdown page with both, around the block to generate.")


def write_page(page: Path, report: dict) -> None:
    """Replace the block between ``page``'s markers with ``page_block(report)``."""
    text = page.read_text()
    head, rest = text[:text.index(BEGIN) + len(BEGIN)], text[text.index(END):]
    page.write_text(f"{head}\n{page_block(report)}\n{rest}")


def main(argv: list[str]) -> int:
    only_flags(argv)
    check_outputs()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # through run_groups' cleanup
    if FLAGS.model is not None:
        check_name(FLAGS.model)
        if FLAGS.case:
            raise UserError(f"Invalid `--case` with `--model`. Received: --case={','.join(FLAGS.case)} and "
                            f"--model={FLAGS.model}. Expected one of them: --model checks the setup it names, "
                            "--case the drawn cases it names.")
    seeds, modes = ([0] if FLAGS.model else _seeds()), _modes()
    cases = {} if FLAGS.model else {seed: space.draw(seed) for seed in seeds}
    with tempfile.TemporaryDirectory(prefix="tfdist-check-") as directory:
        reports = run_groups(seeds, modes, Path(directory), FLAGS.timeout, FLAGS.model)
    records, failing = [], 0
    for report in reports:
        if "unfinished" in report:
            failing += 1
            print(f"crashed  {report['group']}: the processes ended before every case ran; their last lines:\n"
                  f"{report['unfinished']}")
            continue
        if "not_run" in report:
            failing += 1
            pairs = report["not_run"]
            print(f"timeout  {report['group']}: --timeout {FLAGS.timeout:g} s passed; {len(pairs)} verdicts not run"
                  + (f": cases {', '.join(str(s) for s in dict.fromkeys(s for s, _ in pairs))}" if pairs else ""))
            continue
        mixed, after = report["mixed_float16"], report.get("after_crash")
        restarted = f", restarted after case {after['seed']} crashed in {after['mode']}" if after else ""
        mixed_floor = f"{mixed['noise_floor']:.2g}, {mixed['tolerance']:.2g}" if mixed else "no case of it"
        print(f"{report['task']}: noise floor {report['noise_floor']:.2g}, tolerance {report['tolerance']:.2g} "
              f"(mixed_float16: {mixed_floor}){restarted}")
        for record in report["records"]:
            records.append({**record, "task": report["task"]})
            if record["class"] in verdict.FAILING or record["class"] == "invalid":
                failing += record["class"] != "invalid"
                what, alone = ((FLAGS.model, f"--model {FLAGS.model}") if FLAGS.model else
                               (cases[record["seed"]].describe(), f"--case {record['seed']}"))
                print(f"{record['class']:8} {record['mode']} on {report['task']}: {what}\n"
                      f"         {record['detail']}\n"
                      f"         alone: python -m tfdist.check {alone} --modes {record['mode']}")
    for line in fresh_lines(records):
        print(line)
    counts = collections.Counter((r["mode"], r["class"]) for r in records)
    for mode in modes:
        print(f"{mode}: " + ", ".join(f"{counts[(mode, c)]} {c}" for c in verdict.CLASSES if counts[(mode, c)]))
    if FLAGS.output:
        Path(FLAGS.output).write_text(json.dumps({"seeds": seeds, "modes": modes, "records": records}, indent=1))
    matrix = cells(cases, records)
    report = {"command": run_command(sys.argv[1:]), "cases": len(seeds),
              "modes": modes, "cells": matrix}
    if FLAGS.markdown:
        Path(FLAGS.markdown).write_text(render(matrix, modes) + "\n")
    if FLAGS.matrix:
        Path(FLAGS.matrix).write_text(json.dumps(report, indent=0) + "\n")
    if FLAGS.page:
        write_page(Path(FLAGS.page), report)
    verdicts = "every one equal, trained or refused" if not failing else f"{failing} differ, crashed or timed out"
    print(f"{len(seeds)} case{'s' * (len(seeds) != 1)}, {len(records)} verdicts: {verdicts}")
    return 1 if failing else 0


def entry() -> None:
    """The ``tfdist-check`` console script."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
