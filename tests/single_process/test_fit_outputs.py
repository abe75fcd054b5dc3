"""``tfdist.fit``'s History for every entry Keras' ``fit`` reports, and Keras' own ``evaluate`` of the model it
returns, against one device.

In one fresh process (2 logical CPUs), each model trains with Keras' own ``model.fit`` on one device and with
``tfdist.fit`` under ``mirrored`` and ``central_storage`` (2 replicas), from the same initial weights,
``shuffle=False``, 203 rows in batches of 32 (the last batch of 11 splits 6/5):

- a model with two outputs, ``loss={"label": ..., "value": ...}`` and ``loss_weights``, with ``sample_weight`` and
  ``validation_data``: the History holds ``loss``, ``label_loss``, ``value_loss`` and the ``val_*`` of each,
  with Keras' values (each output's loss averages the steps' means, as Keras' trackers do);
- ``F1Score()`` and ``FBetaScore()`` with ``average=None``: one value per class, a numpy array in each epoch's
  entry, as Keras' History holds it;
- Keras' own ``evaluate`` of the returned model (its loss tracker and metrics updated by each replica) equals
  one device's evaluate of the same weights, on 40 rows in batches of 32 (16/16 then 4/4).

A model with its own ``train_step`` and loss tracker (the check's ``own_train_step``) and synchronized batch norm
(whose moving statistics TensorFlow refuses to update from a replica without an aggregation under
``central_storage``) are families of the check, whose fixed sample (``tests/cluster/test_check.py``) compares
every History entry, ``evaluate`` and ``predict`` with one device in these modes and on 2 workers.
"""

from __future__ import annotations

import pytest

from helpers.outputs import script_results

SCRIPT = r"""
import json
from tfdist.strategies import setup_host
setup_host(cpu_devices=2)
import numpy as np, keras, tensorflow as tf
import tfdist

rng = np.random.default_rng(0)
x = rng.normal(size=(203, 6)).astype(np.float32)
labels = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
values = (x[:, :3].sum(axis=1, keepdims=True) + 0.1 * rng.normal(size=(203, 1))).astype(np.float32)
sw = (0.5 + rng.random(203)).astype(np.float32)
xv = rng.normal(size=(40, 6)).astype(np.float32)
yv = {"label": (xv[:, 0] > 0).astype(np.int64), "value": xv[:, :3].sum(axis=1, keepdims=True)}
onehot, onehot_v = np.eye(3, dtype=np.float32)[labels], np.eye(3, dtype=np.float32)[yv["label"]]

def two_outputs():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, {"label": keras.layers.Dense(3, activation="softmax", name="label")(hidden),
                                 "value": keras.layers.Dense(1, name="value")(hidden)})
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss={"label": "sparse_categorical_crossentropy",
                  "value": "mse"}, loss_weights={"label": 1.0, "value": 0.3},
                  metrics={"label": [keras.metrics.SparseCategoricalAccuracy()]})
    return model

def classifier(metrics):
    def model_fn():
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy", metrics=metrics())
        return model
    return model_fn

def plain(value):
    if isinstance(value, np.ndarray):
        return {"array": value.tolist()}
    return float(value)

runs = {
    "two_outputs": (two_outputs, dict(x=x, y={"label": labels, "value": values}, sample_weight=sw,
                                      validation_data=(xv, yv)), (xv, yv)),
    "per_class": (classifier(lambda: [keras.metrics.F1Score(), keras.metrics.FBetaScore(beta=2.0)]),
                  dict(x=x, y=onehot, validation_data=(xv, onehot_v)), (xv, onehot_v)),
    "accuracy": (classifier(lambda: ["accuracy", keras.metrics.CategoricalAccuracy(name="acc")]),
                 dict(x=x, y=onehot), (xv, onehot_v)),
}
out = {}
for name, (model_fn, kwargs, held_out) in runs.items():
    reference = model_fn()
    expected = reference.fit(batch_size=32, epochs=3, shuffle=False, verbose=0, **kwargs).history
    for strategy in ("mirrored", "central_storage"):
        got = tfdist.fit(model_fn, batch_size=32, epochs=3, shuffle=False, verbose=0, strategy=strategy, **kwargs)
        row = {"keras": {k: [plain(v) for v in vs] for k, vs in expected.items()},
               "tfdist": {k: [plain(v) for v in vs] for k, vs in got.history.items()},
               "weights": max(float(np.abs(a - b).max() / np.abs(b).max())
                              for a, b in zip(got.model.get_weights(), reference.get_weights()))}
        if held_out is not None:
            one_device = model_fn()
            one_device.set_weights(got.model.get_weights())
            row["evaluate"] = got.model.evaluate(*held_out, batch_size=32, verbose=0, return_dict=True)
            row["one_device"] = one_device.evaluate(*held_out, batch_size=32, verbose=0, return_dict=True)
        out[f"{name}-{strategy}"] = row
print("RESULTS " + json.dumps(out, default=plain))
"""

CASES = [f"{name}-{strategy}" for name in ("two_outputs", "per_class", "accuracy")
         for strategy in ("mirrored", "central_storage")]


def results() -> dict:
    return script_results("fit_outputs", ["-c", SCRIPT], timeout=900)


def _close(got, expected) -> bool:
    """Two History or evaluate values alike within 1e-6 relative: floats, or ``{"array": [...]}`` of one shape."""
    if isinstance(expected, dict):
        return isinstance(got, dict) and got["array"] == pytest.approx(expected["array"], rel=1e-6, abs=1e-7)
    return not isinstance(got, dict) and got == pytest.approx(expected, rel=1e-6, abs=1e-7)


@pytest.mark.xdist_group("fit_outputs")
@pytest.mark.parametrize("case", CASES)
def test_every_history_entry_equals_keras_fit_on_one_device(case):
    run = results()[case]
    expected, got = run["keras"], run["tfdist"]
    assert sorted(got) == sorted(expected), (got, expected)
    for key, values in expected.items():
        assert len(got[key]) == len(values) and all(_close(g, v) for g, v in zip(got[key], values)), \
            (key, got[key], values)
    assert run["weights"] <= 1e-6, run["weights"]


@pytest.mark.xdist_group("fit_outputs")
def test_two_outputs_report_each_output_loss_and_per_class_metrics_an_array():
    run = results()
    assert {"label_loss", "value_loss", "val_label_loss", "val_value_loss"} <= set(run["two_outputs-mirrored"]["keras"])
    f1 = run["per_class-mirrored"]["tfdist"]["f1_score"]
    assert all(isinstance(v, dict) and len(v["array"]) == 3 for v in f1), f1  # one value per class, an array


@pytest.mark.xdist_group("fit_outputs")
@pytest.mark.parametrize("case", CASES)
def test_keras_evaluate_of_the_returned_model_equals_one_device(case):
    run = results()[case]
    assert sorted(run["evaluate"]) == sorted(run["one_device"]), run
    for key, value in run["one_device"].items():
        assert _close(run["evaluate"][key], value), (key, run["evaluate"][key], value)
