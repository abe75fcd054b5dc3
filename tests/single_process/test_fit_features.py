"""Keras' optimizer and compile features under ``parameter_server``: each trains, or is the refusal ``REFUSED`` names.

The test runs ``helpers/feature_runs.py`` in a fresh process, a coordinator with an in-process cluster of 2 workers
and a ps task: every feature of its matrix trains with Keras' own ``model.fit`` on one device and then with
``tfdist.fit`` under ``parameter_server``. Its workers apply their steps asynchronously, so each cell says that it
trained (and how far from one device it ended), or is the exact refusal line; the kinds must match
docs/fit-features.json. The synchronous modes' cells of the same features (one device, ``mirrored``,
``central_storage``, Keras' own fit over 2 replicas) are cases of the check's fixed sample
(``tests/cluster/test_check.py``), which compares every History entry, the weights and the optimizer's state.
"""

from __future__ import annotations

import pytest

from helpers.clis import HELPERS
from helpers.feature_matrix import cell, check_columns
from helpers.outputs import tagged

SCRIPT = HELPERS / "feature_runs.py"


@pytest.mark.slow
def test_every_feature_trains_under_parameter_server_or_is_refused_in_one_line(python):
    result = python([str(SCRIPT)], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    results = tagged(result.stdout, "RESULTS")
    cells = {feature: {mode: cell(feature, mode, result) for mode, result in row.items()}
             for feature, row in results.items()}
    check_columns(cells)
