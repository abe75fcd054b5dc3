"""``tfdist.fit`` reads the inputs Keras' ``fit`` reads as Keras' ``fit`` reads them.

In one fresh process (2 logical CPUs), a small dense model (256 rows, global batch 64, 2 epochs,
``keras.utils.set_random_seed(0)`` in ``model_fn``) trains with Keras' own ``fit`` on one device and with
``tfdist.fit`` under ``one_device``, ``mirrored`` and ``central_storage``, on:

- numpy arrays under Keras' default ``shuffle=True`` (an order that trains apart from the rows as given), and
  ``shuffle="batch"``: the rows in Keras' order;
- a Python generator: one epoch to its end, and ``steps_per_epoch`` over an endless one;
- ``x`` a list of one tensor with numpy ``y``.

Every epoch's figures and the final weights equal Keras' (float rounding only). What Keras' ``fit`` cannot train
alike is one line naming the input kind. A ``keras.utils.PyDataset`` (its batch order drawn each epoch under
``shuffle=True``, with ``workers=2``, as ``validation_data``) is an input kind of the check, whose fixed sample
(``tests/cluster/test_check.py``) trains it in every mode and on 2 workers.
"""

from __future__ import annotations

import pytest

from helpers.outputs import script_results

SCRIPT = r'''
from tfdist.strategies import setup_host
setup_host(cpu_devices=2)
import json
import numpy as np
import keras
import tensorflow as tf
import tfdist
from tfdist.errors import UserError

rng = np.random.default_rng(0)
x = rng.random((256, 8), dtype=np.float32)
y = x @ rng.random((8, 1), dtype=np.float32)


def model_fn():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs)))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


class Endless(keras.utils.PyDataset):
    """Batches of 64 rows that say no length (``num_batches`` None)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return x[i * 64:(i + 1) * 64], y[i * 64:(i + 1) * 64]

    @property
    def num_batches(self):
        return None


def batches():
    for i in range(0, 256, 64):
        yield x[i:i + 64], y[i:i + 64]


def endless():
    while True:
        yield from batches()


ALL = ("one_device", "mirrored", "central_storage")
CASES = {
    "shuffle": (lambda: dict(x=x, y=y, batch_size=64, epochs=2), ("mirrored",)),
    "shuffle_batch": (lambda: dict(x=x, y=y, batch_size=64, epochs=2, shuffle="batch"), ALL[:2]),
    "generator": (lambda: dict(x=batches(), epochs=1), ALL),
    "generator_steps": (lambda: dict(x=endless(), epochs=2, steps_per_epoch=4), ALL[:2]),
    "tensor_list": (lambda: dict(x=[tf.constant(x)], y=y, batch_size=64, epochs=2), ALL[:2]),
}
out = {}
for name, (case, _) in CASES.items():
    model = model_fn()
    history = model.fit(**case(), verbose=0).history
    out[f"{name} keras"] = {"history": history, "weights": [w.tolist() for w in model.get_weights()]}
model = model_fn()
model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
out["rows as given keras"] = {"weights": [w.tolist() for w in model.get_weights()]}
for name, (case, strategies) in CASES.items():
    for strategy in strategies:
        fitted = tfdist.fit(model_fn, **case(), verbose=0, strategy=strategy)
        out[f"{name} {strategy}"] = {"history": fitted.history,
                                     "weights": [w.tolist() for w in fitted.model.get_weights()]}
refused = {"generator_epochs": dict(x=batches(), epochs=2),
           "generator_class_weight": dict(x=batches(), class_weight={0: 1.0}),
           "endless_pydataset": dict(x=Endless())}
for name, kwargs in refused.items():
    try:
        tfdist.fit(model_fn, **kwargs, verbose=0, strategy="one_device")
        out[name] = "trained"
    except UserError as e:
        out[name] = str(e)
print("RESULTS " + json.dumps(out))
'''

#: ``case: strategies`` of each ``tfdist.fit`` run. Numpy rows under Keras' ``shuffle=True`` and a ``PyDataset``
#: (with ``workers=2``, and as ``validation_data``), under each strategy and on 2 workers, are the check's input
#: kinds (its fixed sample: ``tests/cluster/test_check.py``).
CASES = {"shuffle": ("mirrored",), "shuffle_batch": ("one_device", "mirrored"),
         "generator": ("one_device", "mirrored", "central_storage"), "generator_steps": ("one_device", "mirrored"),
         "tensor_list": ("one_device", "mirrored")}


def results() -> dict:
    return script_results("fit_keras_inputs", SCRIPT)


def _largest_difference(a, b) -> float:
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


@pytest.mark.xdist_group("fit_keras_inputs")
@pytest.mark.parametrize("case,strategy", [(case, strategy) for case, strategies in CASES.items()
                                           for strategy in strategies])
def test_input_trains_as_keras_fit_on_one_device(case, strategy):
    out = results()
    keras_run, run = out[f"{case} keras"], out[f"{case} {strategy}"]
    assert set(run["history"]) == set(keras_run["history"]), (run["history"], keras_run["history"])
    for key, expected in keras_run["history"].items():
        assert run["history"][key] == pytest.approx(expected, rel=1e-6), (key, run["history"], expected)
    assert _largest_difference(run["weights"], keras_run["weights"]) < 1e-6
    assert keras_run["history"]["loss"][-1] < keras_run["history"]["loss"][0] or len(keras_run["history"]["loss"]) == 1


@pytest.mark.xdist_group("fit_keras_inputs")
def test_keras_shuffle_is_not_the_rows_as_given():
    # The order matters: Keras' shuffled run and an unshuffled one train apart, so equality above is the order's.
    out = results()
    assert _largest_difference(out["shuffle keras"]["weights"], out["rows as given keras"]["weights"]) > 1e-3


@pytest.mark.xdist_group("fit_keras_inputs")
@pytest.mark.parametrize("name,start", [
    ("generator_epochs", "Missing `steps_per_epoch` for a Python generator `x` over 2 epochs."),
    ("generator_class_weight", "Invalid `class_weight` with a Python generator `x`."),
    ("endless_pydataset", "Missing `steps_per_epoch`. Received: an input of unknown length (a "
                          "keras.utils.PyDataset whose num_batches is None"),
])
def test_what_keras_cannot_train_alike_is_one_line_naming_the_input(name, start):
    message = results()[name]
    assert message.startswith(start), message
    assert "\n" not in message
