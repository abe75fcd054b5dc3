"""Keras' optimizer and compile features across replicas equal one device, in ``tfdist.fit`` and in Keras' fit.

Each test runs ``helpers/feature_runs.py`` in fresh processes (2 logical CPUs, or an in-process
parameter-server cluster): every feature of its matrix trains with Keras' own ``model.fit`` on one device and
then in each mode. Every cell must equal one device in per-epoch loss and final weights within
``feature_matrix.TOLERANCE`` (the float32 noise floor with room), or be the refusal ``REFUSED`` names; the kinds
must match docs/fit-features.json. Clipping each replica's partial
gradient, an EMA left unfinalized, a loss scaled by the replicas or ``jit_compile`` ignored each change a
cell.
"""

from __future__ import annotations

import pytest

from helpers.clis import HELPERS
from helpers.feature_matrix import cell, check_columns
from helpers.outputs import tagged

SCRIPT = HELPERS / "feature_runs.py"


def measured(python, modes) -> dict:
    result = python([str(SCRIPT), *modes], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return tagged(result.stdout, "RESULTS")


@pytest.mark.slow
@pytest.mark.parametrize("modes", [("one_device", "mirrored"), ("central_storage", "keras_mirrored"),
                                   ("parameter_server",)], ids="+".join)
def test_every_feature_equals_one_device_or_is_refused_in_one_line(python, modes):
    results = measured(python, modes)
    cells = {feature: {mode: cell(feature, mode, result) for mode, result in row.items()}
             for feature, row in results.items()}
    check_columns(cells)
