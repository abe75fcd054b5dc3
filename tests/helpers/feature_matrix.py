"""The feature matrix of docs/fit.md: cells measured by the feature tests, kept in docs/fit-features.json.

A test that runs ``feature_runs`` turns each result into a cell (``cell``), checks it (equal to one device
within ``TOLERANCE``, or the refusal that ``REFUSED`` names) and compares the kind of each cell with the
committed JSON; with ``TFDIST_UPDATE_MATRIX=1`` it writes its columns there instead. A unit test checks
that docs/fit.md's table is ``render`` of that JSON, so the page shows what the tests measured.
"""

from __future__ import annotations

import json
import os

from helpers.clis import REPO

MATRIX = REPO / "docs" / "fit-features.json"
PAGE = REPO / "docs" / "fit.md"
BEGIN, END = "<!-- feature-matrix -->", "<!-- /feature-matrix -->"

#: The largest relative differences from one device that count as equal: per-epoch loss and final weights
#: (each tensor's relative L2): the float32 noise floor of 2 replicas with room, as docs/fit.md says (its
#: matrix shows what each cell measured).
TOLERANCE = {"loss": 1e-6, "weights": 2e-6}

#: The column order of the page, and each mode's heading.
COLUMNS = {
    "one_device": "`tfdist.fit` one_device",
    "mirrored": "`tfdist.fit` mirrored (2 CPUs)",
    "central_storage": "`tfdist.fit` central_storage (2 CPUs)",
    "multi_worker_mirrored": "`tfdist.fit` 2 workers",
    "parameter_server": "`tfdist.fit` parameter_server, 2 workers",
    "keras_mirrored": "Keras' `fit`, mirrored (2 CPUs), after `setup`",
    "keras_multi_worker_mirrored": "Keras' `fit`, 2 workers, after `setup`",
}

#: ``(feature, mode) -> the start of the refusal's line`` for every cell that must be refused.
REFUSED = {
    ("jit_compile=True", "central_storage"): "Invalid compile(jit_compile=True) under central_storage",
    ("jit_compile=True", "parameter_server"): "Invalid compile(jit_compile=True) under parameter_server",
    ("jit_compile=True", "keras_mirrored"): "Invalid compile(jit_compile=True) for Keras' own fit",
    ("steps_per_execution=4", "keras_mirrored"): "Invalid compile(steps_per_execution=4) for Keras' own fit",
    ("jit_compile=True", "keras_multi_worker_mirrored"): "Invalid compile(jit_compile=True) for Keras' own fit",
    ("own train_step (compute_loss)", "parameter_server"): "Invalid model for tfdist.fit under",
    ("own train_step + clipnorm", "parameter_server"): "Invalid model for tfdist.fit under",
    ("gradient_accumulation_steps=2", "parameter_server"): "Invalid optimizer for strategy=",
}

#: Modes whose workers apply steps asynchronously, each reading the batches in its own order: their cells say
#: that they trained (and how far from one device they ended), not that they are equal.
ASYNCHRONOUS = ("parameter_server",)


def cell(feature: str, mode: str, result: dict) -> dict:
    """The checked cell of one result: ``{"kind": "equal"|"trained"|"refused", ...}``; fails on a wrong one."""
    expected = REFUSED.get((feature, mode))
    if "refused" in result:
        line = result["refused"]
        assert expected is not None and line.startswith(expected), (feature, mode, line)
        assert "\n" not in line, line
        return {"kind": "refused", "line": line}
    assert expected is None, (feature, mode, "trained; expected the refusal", expected)
    if mode in ASYNCHRONOUS:
        return {"kind": "trained", "loss": result["loss"], "weights": result["weights"]}
    assert result["loss"] <= TOLERANCE["loss"] and result["weights"] <= TOLERANCE["weights"], (feature, mode, result)
    return {"kind": "equal", "loss": result["loss"], "weights": result["weights"]}


def check_columns(cells: dict[str, dict[str, dict]]) -> None:
    """Compare the kinds and lines of ``cells`` (feature -> mode -> cell) with the JSON, or write them there."""
    committed = json.loads(MATRIX.read_text()) if MATRIX.exists() else {}
    if os.environ.get("TFDIST_UPDATE_MATRIX") == "1":
        for feature, row in cells.items():
            committed.setdefault(feature, {}).update(row)
        MATRIX.write_text(json.dumps(committed, indent=1) + "\n")
        return
    for feature, row in cells.items():
        for mode, got in row.items():
            kept = committed.get(feature, {}).get(mode)
            assert kept is not None, f"docs/fit-features.json has no cell {feature!r} x {mode!r}"
            assert (got["kind"], got.get("line")) == (kept["kind"], kept.get("line")), (feature, mode, got, kept)


def _text(value: dict, refusals: list[str]) -> str:
    if value["kind"] == "refused":
        if value["line"] not in refusals:
            refusals.append(value["line"])
        return f"refused ({refusals.index(value['line']) + 1})"
    figures = f"loss {value['loss']:.0e}, weights {value['weights']:.0e}"
    return {"equal": f"≡ one device ({figures})", "trained": f"trains, asynchronous ({figures})"}[value["kind"]]


def render(matrix: dict) -> str:
    """The markdown table (and its numbered refusals) of a matrix as docs/fit-features.json holds it."""
    modes = [m for m in COLUMNS if any(m in row for row in matrix.values())]
    lines = ["| feature | " + " | ".join(COLUMNS[m] for m in modes) + " |",
             "|---|" + "---|" * len(modes)]
    refusals: list[str] = []
    for feature in matrix:
        row = matrix[feature]
        lines.append(f"| {feature} | " + " | ".join(_text(row[m], refusals) if m in row else "–" for m in modes)
                     + " |")
    lines.append("")
    lines += [f"{i}. {line}" for i, line in enumerate(refusals, 1)]
    return "\n".join(lines)


def page_block() -> str:
    """The text between the page's matrix markers."""
    text = PAGE.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")


def write_page_block() -> None:
    """Put ``render`` of the JSON between the page's markers."""
    text = PAGE.read_text()
    head, rest = text[:text.index(BEGIN) + len(BEGIN)], text[text.index(END):]
    PAGE.write_text(f"{head}\n{render(json.loads(MATRIX.read_text()))}\n{rest}")
