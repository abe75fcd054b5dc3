"""The feature tests' cells, kept in docs/fit-features.json.

The test that runs ``feature_runs`` turns each result into a cell (``cell``): trained (``parameter_server``'s
workers apply their steps asynchronously, each reading the batches in its own order, so a cell says that it
trained and how far from one device it ended, not that it is equal), or the refusal that ``REFUSED`` names. It
compares the kind and refusal line of each cell with the committed JSON; with ``TFDIST_UPDATE_MATRIX=1`` it writes
its column there instead. The JSON's columns of the synchronous modes were measured by the same features in those
modes, whose cases the check's fixed sample holds (``tests/cluster/test_check.py``).
"""

from __future__ import annotations

import json
import math
import os

from helpers.clis import REPO

MATRIX = REPO / "docs" / "fit-features.json"

#: ``(feature, mode) -> the start of the refusal's line`` for every cell that must be refused.
REFUSED = {
    ("own train_step (compute_loss)", "parameter_server"): "Invalid model for tfdist.fit under",
    ("own train_step + clipnorm", "parameter_server"): "Invalid model for tfdist.fit under",
    ("gradient_accumulation_steps=2", "parameter_server"): "Invalid optimizer for strategy=",
}


def cell(feature: str, mode: str, result: dict) -> dict:
    """The checked cell of one result: ``{"kind": "trained"|"refused", ...}``; fails on a wrong one."""
    expected = REFUSED.get((feature, mode))
    if "refused" in result:
        line = result["refused"]
        assert expected is not None and line.startswith(expected), (feature, mode, line)
        assert "\n" not in line, line
        return {"kind": "refused", "line": line}
    assert expected is None, (feature, mode, "trained; expected the refusal", expected)
    assert math.isfinite(result["loss"]) and math.isfinite(result["weights"]), (feature, mode, result)
    return {"kind": "trained", "loss": result["loss"], "weights": result["weights"]}


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
