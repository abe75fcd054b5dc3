"""``tfdist.fit``'s ``validation_freq`` as a list of epochs, and ``validation_data`` given with a split.

In one fresh process (2 logical CPUs), a small classifier trains with Keras' own ``model.fit`` on one device
and with ``tfdist.fit`` under ``mirrored`` (2 replicas), from the same initial weights, ``shuffle=False``:
``validation_split=0.2`` with ``validation_freq=[1, 4]``, and ``validation_data`` given with a split (it wins,
as in Keras). Every History key (loss, metrics, and the ``val_*`` of the epochs Keras evaluates) and the final
weights equal Keras' to float rounding.

``validation_split`` (with ``sample_weight``), an int ``validation_freq`` and ``F1Score`` (which creates its
variables at its first ``update_state``) are families of the check, whose fixed sample
(``tests/cluster/test_check.py``) compares them with one device in one process and on 2 workers.
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
xv, yv = rng.normal(size=(40, 6)).astype(np.float32), rng.integers(0, 3, 40)

def classifier():
    def model_fn():  # new metric objects at each call
        return dense(6, 3, hidden=(8,), output_activation="softmax", seed=2, optimizer=keras.optimizers.SGD(0.1),
                     loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model_fn

runs = {
    "freq_list": (classifier(), dict(x=x, y=labels, validation_split=0.2, validation_freq=[1, 4])),
    "data_wins": (classifier(), dict(x=x, y=labels, validation_data=(xv, yv), validation_split=0.5)),
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
@pytest.mark.parametrize("name", ["freq_list", "data_wins"])
def test_fit_equals_keras_fit_on_one_device(name):
    run = results()[name]
    expected, got = run["keras"], run["tfdist"]
    assert sorted(got) == sorted(expected), (got, expected)
    for key, values in expected.items():
        assert got[key] == pytest.approx(values, rel=1e-6, abs=1e-7), (key, got[key], values)
    assert run["weights"] <= 1e-6, run["weights"]
    validated = {"freq_list": 2}.get(name, 4)  # the epochs Keras evaluates after
    assert len(expected["loss"]) == 4 and len(expected["val_loss"]) == validated, expected
