"""``python -m tfdist.check`` end to end: a fixed sample of the space, each case trained by ``tfdist.fit`` and by
Keras' own ``fit`` in one process of 2 logical CPUs and on a 2-worker cluster under ``tfdist.launch``, every
worker's History, weights, optimizer state, ``evaluate`` and ``predict`` equal to Keras' one-device ``fit``.

The sample: synchronized batch norm with ``F1Score``, ``validation_split`` and ``validation_freq``; Lion on a
``PyDataset`` whose last batch splits evenly; a dict of two inputs with Ftrl, weight decay, a ``clipnorm`` that
clips every step, ``sample_weight``, ``validation_split`` and ``steps_per_execution``; an ``Embedding`` (a sparse
gradient) with a ``LearningRateSchedule`` and ``steps_per_execution=2`` on a last batch that splits unevenly (2 rows
and 1), and another with Adadelta, ``clipvalue``, ``sample_weight`` and ``validation_freq=2`` (its gather's rows
change within one call of ``tfdist.fit``'s steps); keras.io's GAN (no ``call()``, two optimizers, one of them Nadam) on a Dataset of images alone with
TensorBoard's files; an autoencoder on ``x`` alone, shuffled, on a last batch that splits unevenly, stopped after
its first epoch and resumed by ``BackupAndRestore``; the keras.io guide's own ``train_step`` (``compute_loss``)
with AdamW's weight decay, an EMA overwritten every 3 steps, a ``LossScaleOptimizer`` over a ``clipnorm`` and a
schedule; two outputs with ``loss_weights``, Lamb, ``global_clipnorm``, gradient accumulation, an EMA and a
``PyDataset`` of 2 workers (and as ``validation_data``), with ``CSVLogger``; a conv net with Adafactor, a
``clipvalue`` that clips every step and a schedule; a conv net compiled with ``jit_compile=True`` (without XLA where
the step all-reduces over CPU replicas or reads variables kept apart).

A verdict that crashes the collectives of its processes is followed by one in fresh processes.
"""

from __future__ import annotations

import json

import pytest

from helpers.clis import HELPERS, run_cli
from tfdist.check import runs

SAMPLE = ("288545019", "1222356006", "1722851097", "838732814", "1101493884", "2018194228", "5139", "276772", "148497",
          "12264", "17635")
MODES = ("one_device", "mirrored", "central_storage", "keras_mirrored", "multi_worker_mirrored",
         "keras_multi_worker_mirrored")


@pytest.mark.slow
def test_a_fixed_sample_equals_one_device_in_every_mode_on_every_worker(tmp_path):
    output = tmp_path / "check.json"
    proc = run_cli("tfdist.check", "--case", ",".join(SAMPLE), "--modes", ",".join(MODES), "--output", str(output),
                   "--markdown", str(tmp_path / "check.md"), "--timeout", "900", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    records = json.loads(output.read_text())["records"]
    seen = {(r["seed"], r["mode"], r["task"]) for r in records}
    for seed in map(int, SAMPLE):
        for mode in MODES:
            tasks = ("worker-0", "worker-1") if runs.MODES[mode].group == "workers" else ("local",)
            assert all((seed, mode, task) in seen for task in tasks), (seed, mode)
    for record in records:
        assert record["class"] == "equal", record
    assert "| model | synchronized_bn |" in (tmp_path / "check.md").read_text()
    # No case of the sample computes in mixed_float16: no process measured that precision's control.
    assert proc.stdout.count("(mixed_float16: no case of it)") == 3, proc.stdout[-3000:]


@pytest.mark.slow
def test_after_a_verdict_that_crashes_the_cluster_the_next_runs_in_a_fresh_one_and_is_equal(tmp_path):
    # The setup's callback plants, once per worker, an all-reduce of another shape on each worker: TensorFlow
    # then aborts every later collective of those processes; in fresh ones the callback does nothing.
    output, modes = tmp_path / "check.json", "keras_multi_worker_mirrored,multi_worker_mirrored"
    proc = run_cli("tfdist.check", "--model", f"{HELPERS / 'check_crash_once.py'}:setup", "--modes", modes,
                   "--output", str(output), "--timeout", "600", timeout=900, env={"CHECK_CRASH_DIR": str(tmp_path)},
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    records = {(r["mode"], r["task"]): r for r in json.loads(output.read_text())["records"]}
    assert sorted(records) == sorted((m, t) for m in modes.split(",") for t in ("worker-0", "worker-1"))
    crash = {"seed": 0, "mode": "keras_multi_worker_mirrored"}
    for task in ("worker-0", "worker-1"):
        assert records[("keras_multi_worker_mirrored", task)]["class"] == "crashed"
        assert "after_crash" not in records[("keras_multi_worker_mirrored", task)]
        assert records[("multi_worker_mirrored", task)]["class"] == "equal", records
        assert records[("multi_worker_mirrored", task)]["after_crash"] == crash
    # The worker whose all-reduce TensorFlow refused names it, and itself, in one line.
    details = [records[("keras_multi_worker_mirrored", t)]["detail"] for t in ("worker-0", "worker-1")]
    assert any(d.startswith("CollectiveFailed: A collective failed in Keras' fit across 2 workers, on worker:")
               and "the all-reduce" in d and "in mismatched: Shape mismatch" in d for d in details), details
    assert ("restarted after case 0 crashed in keras_multi_worker_mirrored: 2 verdicts of its processes ran in "
            "fresh ones (case 0 in multi_worker_mirrored)") in proc.stdout
