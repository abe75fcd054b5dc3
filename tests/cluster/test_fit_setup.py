"""``tfdist.fit`` in a script that builds its datasets first: after ``tfdist.setup``, and without it.

The script below (written to the test's directory) starts as a Keras user's
script does: ``tfdist.setup(strategy)`` at the top, then a ``tf.data``
pipeline built before the call, then ``tfdist.fit``:

- a Dataset of global batches, under ``one_device`` and ``mirrored`` (2
  logical CPUs): the same figures as Keras' own ``fit`` on that Dataset under
  the same strategy;
- numpy rows with ``shuffle=True``: under 2 ``multi_worker_mirrored`` workers
  (``tfdist.launch``) the same history as one device with the same seed, which
  holds only if every worker reads the same order (each worker cuts its slice
  of the same global batch);
- the keras.io guide's lower-level model (its own ``train_step``, no compiled
  loss): under 2 workers, one device's history.

Without ``tfdist.setup``, a Dataset built first and ``tfdist.fit(...,
strategy="mirrored")`` end with one ``UserError`` line that says to call
``tfdist.setup`` at the top (``session.TOO_LATE``).
"""

from __future__ import annotations

import sys

import pytest

from helpers.cluster_runs import REPO, Processes, launcher, loopback_cluster, shared
from helpers.models import source
from single_process.test_fit_custom_steps import MODELS
from tfdist.runtime.session import TOO_LATE
from helpers.outputs import spread, tagged

SCRIPT = MODELS + r'''
import json, sys
import tfdist

strategy = tfdist.setup(sys.argv[1])  # first, as a script creates its strategy first
import numpy as np

sys.path.insert(0, sys.argv[2])
from fit_classifier import make_data, model_fn

x, y = make_data(512, seed=0)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)  # built after the set-up, before the call
rng = np.random.default_rng(3)
xr = rng.random((256, 8), dtype=np.float32)
yr = xr.mean(axis=1, keepdims=True)
out = {"dataset": tfdist.fit(model_fn, dataset, epochs=2, verbose=0).history,
       "shuffled": tfdist.fit(model_fn, x, y, batch_size=64, epochs=2, shuffle=True, seed=7, verbose=0).history,
       "unshuffled": tfdist.fit(model_fn, x, y, batch_size=64, epochs=2, shuffle=False, verbose=0).history,
       "lower": tfdist.fit(builder(Lower, False), xr, yr, batch_size=32, epochs=2, shuffle=False,
                           verbose=0).history}
if sys.argv[1] != "multi_worker_mirrored":
    with strategy.scope():
        out["keras_dataset"] = model_fn().fit(dataset, epochs=2, verbose=0).history
print("RESULTS " + json.dumps(out), flush=True)
'''

WITHOUT_SETUP = source() + r'''
import sys
import numpy as np
import tensorflow as tf
import keras
import tfdist

x = np.zeros((64, 4), np.float32)
y = np.zeros((64, 1), np.float32)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)  # TensorFlow starts here, with 1 CPU device


tfdist.fit(dense, dataset, epochs=1, strategy="mirrored", verbose=0)
'''


def script(directory) -> str:
    path = directory / "fit_after_setup.py"
    path.write_text(SCRIPT)
    return str(path)


def alone(python, tmp_path_factory, strategy: str) -> dict:
    """The script's results in one process under ``strategy`` (once per session)."""
    def make():
        result = python([script(tmp_path_factory.mktemp("setup")), strategy, str(REPO / "examples")], timeout=400)
        assert result.returncode == 0, result.stderr[-3000:]
        return tagged(result.stdout, "RESULTS")

    return shared(f"fit_after_setup_{strategy}", make)


@pytest.mark.xdist_group("fit_setup")
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_dataset_built_after_setup_trains_as_keras_fit(python, tmp_path_factory, strategy):
    out = alone(python, tmp_path_factory, strategy)
    assert spread(out["dataset"], out["keras_dataset"]) < 1e-5, (out["dataset"], out["keras_dataset"])
    assert out["dataset"]["loss"][1] < out["dataset"]["loss"][0]
    # shuffle=True reads another order than shuffle=False: the shuffle is on.
    assert out["shuffled"]["loss"][0] != pytest.approx(out["unshuffled"]["loss"][0], rel=1e-4)


@pytest.mark.xdist_group("fit_setup")
def test_two_workers_read_one_order_and_train_as_one_device(python, tmp_path, tmp_path_factory):
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, script(tmp_path), "multi_worker_mirrored",
                                              str(REPO / "examples")))
        status, text = proc.wait(400), proc.text()
    assert status == 0, text[-4000:]
    results = {task: tagged("\n".join(line[len(f"[{task}] "):] for line in text.splitlines()
                                      if line.startswith(f"[{task}] ")), "RESULTS")
               for task in ("worker:0", "worker:1")}
    assert results["worker:0"] == results["worker:1"]
    one_device = alone(python, tmp_path_factory, "one_device")
    for key in ("dataset", "shuffled", "unshuffled", "lower"):
        assert spread(results["worker:0"][key], one_device[key]) < 1e-5, (key, results["worker:0"][key],
                                                                          one_device[key])


def test_a_dataset_built_before_fit_without_setup_is_one_line(python):
    result = python(WITHOUT_SETUP, timeout=240)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # One exception, raised alone (no chained cause, nothing raised while handling it), as the last line.
    assert [line for line in lines if line.startswith("Traceback")] == ["Traceback (most recent call last):"]
    assert lines[-1].startswith("tfdist.errors.UserError: Invalid set-up order for strategy='mirrored': "
                                "TensorFlow had already started."), lines[-1]
    assert lines[-1].endswith(TOO_LATE), lines[-1]
    assert "Preempted" not in result.stderr and "During handling of the above exception" not in result.stderr
