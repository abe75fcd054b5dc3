"""``tfdist.fit``'s ``validation_split`` and ``validation_freq``, and metrics that build at their first update.

In one fresh process (2 logical CPUs), a small classifier trains with Keras' own ``model.fit`` on one device
and with ``tfdist.fit`` under ``mirrored`` (2 replicas), from the same initial weights, ``shuffle=False``:

- ``validation_split=0.2`` (with ``sample_weight``: the last rows of each validate) and ``validation_freq``
  (an int and a list of epochs): every History key (loss, metrics, and the ``val_*`` of the epochs Keras
  evaluates) and the final weights equal Keras' to float rounding; ``validation_data`` given with a split
  wins, as in Keras;
- ``F1Score`` and ``FBetaScore``, which create their variables at their first ``update_state``, train and
  report what one device reports.
"""

from __future__ import annotations

import pytest

from helpers.models import source
from helpers.outputs import script_results

SCRIPT = source() + r"""
import json
from tfdist.strategies import setup_host
setup_host(cpu_devices=2)
import numpy as np, keras
import tfdist

rng = np.random.default_rng(0)
x = rng.normal(size=(203, 6)).astype(np.float32)  # 203 rows: the split's floor matters (162 train, 41 validate)
labels = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
sw = (0.5 + rng.random(203)).astype(np.float32)
xv, yv = rng.normal(size=(40, 6)).astype(np.float32), rng.integers(0, 3, 40)

def classifier(loss="sparse_categorical_crossentropy", metrics=lambda: ["accuracy"]):
    def model_fn():  # new metric objects at each call
        return dense(6, 3, hidden=(8,), output_activation="softmax", seed=2, optimizer=keras.optimizers.SGD(0.1),
                     loss=loss, metrics=metrics())
    return model_fn

runs = {
    "split": (classifier(), dict(x=x, y=labels, validation_split=0.2)),
    "split_weighted": (classifier(), dict(x=x, y=labels, sample_weight=sw, validation_split=0.2)),
    "freq": (classifier(), dict(x=x, y=labels, validation_data=(xv, yv), validation_freq=2)),
    "freq_list": (classifier(), dict(x=x, y=labels, validation_split=0.2, validation_freq=[1, 4])),
    "data_wins": (classifier(), dict(x=x, y=labels, validation_data=(xv, yv), validation_split=0.5)),
    "f1": (classifier("categorical_crossentropy",
                      lambda: [keras.metrics.F1Score(average="macro"),
                               keras.metrics.FBetaScore(beta=2.0, average="micro")]),
           dict(x=x, y=np.eye(3, dtype=np.float32)[labels], validation_data=(xv, np.eye(3, dtype=np.float32)[yv]))),
}
out = {}
for name, (model_fn, kwargs) in runs.items():
    reference = model_fn()
    expected = reference.fit(batch_size=32, epochs=4, shuffle=False, verbose=0, **kwargs).history
    got = tfdist.fit(model_fn, batch_size=32, epochs=4, shuffle=False, verbose=0, strategy="mirrored", **kwargs)
    out[name] = {"keras": expected, "tfdist": got.history,
                 "weights": max(float(np.abs(a - b).max() / np.abs(b).max())
                                for a, b in zip(got.model.get_weights(), reference.get_weights()))}
print("RESULTS " + json.dumps(out, default=float))
"""


def results() -> dict:
    return script_results("fit_validation", ["-c", SCRIPT], timeout=600)


@pytest.mark.xdist_group("fit_validation")
@pytest.mark.parametrize("name", ["split", "split_weighted", "freq", "freq_list", "data_wins", "f1"])
def test_fit_equals_keras_fit_on_one_device(name):
    run = results()[name]
    expected, got = run["keras"], run["tfdist"]
    assert sorted(got) == sorted(expected), (got, expected)
    for key, values in expected.items():
        assert got[key] == pytest.approx(values, rel=1e-6, abs=1e-7), (key, got[key], values)
    assert run["weights"] <= 1e-6, run["weights"]
    validated = {"freq": 2, "freq_list": 2}.get(name, 4)  # the epochs Keras evaluates after
    assert len(expected["loss"]) == 4 and len(expected["val_loss"]) == validated, expected
