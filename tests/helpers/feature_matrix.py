"""The feature tests' cells, kept in docs/fit-features.json.

A test that runs ``feature_runs`` turns each result into a cell (``cell``), checks it (equal to one device
within ``TOLERANCE``, or the refusal that ``REFUSED`` names) and compares the kind and refusal line of each
cell with the committed JSON; with ``TFDIST_UPDATE_MATRIX=1`` it writes its columns there instead.
"""

from __future__ import annotations

import json
import os

from helpers.clis import REPO

MATRIX = REPO / "docs" / "fit-features.json"

#: The largest relative differences from one device that count as equal: per-epoch loss and final weights
#: (each tensor's relative L2): the float32 noise floor of 2 replicas with room (docs/fit-features.json holds
#: what each cell measured).
TOLERANCE = {"loss": 1e-6, "weights": 2e-6}

#: ``(feature, mode) -> the start of the refusal's line`` for every cell that must be refused.
REFUSED = {
    ("jit_compile=True", "central_storage"): "Invalid compile(jit_compile=True) under central_storage",
    ("jit_compile=True", "parameter_server"): "Invalid compile(jit_compile=True) under parameter_server",
    ("jit_compile=True", "keras_mirrored"): "Invalid compile(jit_compile=True) for Keras' own fit",
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
