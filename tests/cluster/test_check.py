"""``python -m tfdist.check`` end to end: a fixed sample of the space, each case trained by ``tfdist.fit`` and by
Keras' own ``fit`` in one process of 2 logical CPUs and on a 2-worker cluster under ``tfdist.launch``, every
worker's History, weights, optimizer state, ``evaluate`` and ``predict`` equal to Keras' one-device ``fit``.

The sample: synchronized batch norm with ``F1Score``, ``validation_split`` and ``validation_freq``; Lion on a
last batch that splits evenly; a dict of two inputs with Ftrl, weight decay, a ``clipnorm`` that clips every
step, ``sample_weight`` and ``steps_per_execution``.
"""

from __future__ import annotations

import json

import pytest

from helpers.clis import run_cli
from tfdist.check import runs

SAMPLE = ("288545019", "1222356006", "1722851097")
MODES = ("one_device", "mirrored", "keras_mirrored", "multi_worker_mirrored", "keras_multi_worker_mirrored")


@pytest.mark.slow
def test_a_fixed_sample_equals_one_device_in_every_mode_on_every_worker(tmp_path):
    output = tmp_path / "check.json"
    proc = run_cli("tfdist.check", "--case", ",".join(SAMPLE), "--modes", ",".join(MODES), "--output", str(output),
                   "--markdown", str(tmp_path / "check.md"), "--timeout", "600", timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    records = json.loads(output.read_text())["records"]
    seen = {(r["seed"], r["mode"], r["task"]) for r in records}
    for seed in map(int, SAMPLE):
        for mode in MODES:
            tasks = ("worker-0", "worker-1") if runs.MODES[mode].group == "workers" else ("local",)
            assert all((seed, mode, task) in seen for task in tasks), (seed, mode)
    assert {r["class"] for r in records} <= {"equal", "refused"}
    assert sum(r["class"] == "equal" for r in records) >= len(records) - 2, records
    assert "| model | synchronized_bn |" in (tmp_path / "check.md").read_text()
