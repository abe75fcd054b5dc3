"""Keras' optimizer and compile features on two workers equal one device, in ``tfdist.fit`` and Keras' fit.

``helpers/feature_runs.py`` runs under ``tfdist.launch`` on a cluster of two workers on 127.0.0.1: each
worker sets up ``multi_worker_mirrored`` with ``tfdist.setup``, trains every feature with Keras' own fit on
one device, then with ``tfdist.fit`` and with Keras' own ``fit`` across both workers. Each cell is checked as
in the single-process matrix (``helpers.feature_matrix``), on both workers.
"""

from __future__ import annotations

import json
import sys

import pytest

from helpers.cluster_runs import Processes, launcher, loopback_cluster
from helpers.clis import HELPERS
from helpers.feature_matrix import cell, check_columns

pytestmark = pytest.mark.slow

MODES = ("multi_worker_mirrored", "keras_multi_worker_mirrored")


def worker_results(text: str) -> dict[str, dict]:
    """``task -> RESULTS`` from the launcher's prefixed output."""
    found = {}
    for line in text.splitlines():
        head, sep, rest = line.partition("RESULTS ")
        if sep:
            found[head.strip().strip("[]")] = json.loads(rest)
    return found


def test_every_feature_on_two_workers_equals_one_device_or_is_refused_in_one_line(tmp_path):
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(HELPERS / "feature_runs.py"), *MODES,
                                              options=("--grace_seconds=20",)))
        status = proc.wait(900)
    assert status == 0, proc.text()[-4000:]
    found = worker_results(proc.text())
    assert sorted(found) == ["worker:0", "worker:1"], proc.text()[-3000:]
    for task, results in found.items():
        cells = {feature: {mode: cell(feature, mode, result) for mode, result in row.items()}
                 for feature, row in results.items()}
        if task == "worker:0":
            check_columns(cells)
