"""``tfdist.fit`` honours a model's own ``train_step``/``test_step``, as Keras' ``fit`` runs them.

In one fresh process (2 logical CPUs), two models of the keras.io guide
"Customizing what happens in fit()" train with Keras' own ``model.fit`` and
with ``tfdist.fit`` under the same strategy (``one_device``, ``mirrored``,
``central_storage``), from the same initial weights, on the same batches:

- ``Lower``: the guide's lower-level model, compiled with an optimizer only:
  its loss computed in ``train_step``, tracked by its own ``keras.metrics.Mean``,
  and its own ``test_step`` for the validation data;
- ``guide_model`` (``helpers.models``): the guide's first model, ``train_step``
  over ``compute_loss`` and the compiled metrics, Keras' own ``test_step``.

Every epoch's figures of ``tfdist.fit`` under each strategy equal Keras' own
``fit`` on one device (the test allows 1e-6 relative for float rounding),
``central_storage`` too, where each replica's metric updates add up once
(``tfdist.one_device.central_storage``).
Keras' own ``MirroredStrategy`` does not for ``guide_model``: it tracks the loss
that ``compute_loss`` divided by the replicas, half of one device's, while
``tfdist.fit`` runs the step with the loss one device sees. A step that returns logs other than the model's
metrics is one ``UserError`` line. ``guide_model`` compiled with ``jit_compile=True`` trains on one device as
Keras' ``fit`` trains it. The same ``Lower`` under 2
``multi_worker_mirrored`` workers is in ``test_fit_setup.py``; under
``parameter_server`` (refused) in ``test_fit_parameter_server.py``.
"""

from __future__ import annotations


import pytest

from helpers.models import source
from helpers.outputs import script_results, spread

STRATEGIES = ("one_device", "mirrored", "central_storage")

MODELS = source() + r'''
import keras
import tensorflow as tf


class Lower(keras.Model):
    """The guide's lower-level model: no compiled loss, its own loss tracker and steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = keras.losses.mean_squared_error(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(keras.losses.mean_squared_error(y, y_pred))
        self.mae_metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


class Misnamed(Lower):
    """Returns a log that is not one of its metrics."""

    def train_step(self, data):
        logs = super().train_step(data)
        return {"batch_loss": logs["loss"]}


def builder(cls, compiled_loss, jit_compile=False):
    def model_fn():
        keras.utils.set_random_seed(2)
        inputs = keras.Input((8,))
        model = cls(inputs, keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs)))
        if compiled_loss:
            model.compile(optimizer=keras.optimizers.SGD(0.02), loss="mse", metrics=["mae"], jit_compile=jit_compile)
        else:
            model.compile(optimizer=keras.optimizers.SGD(0.02), jit_compile=jit_compile)
        return model

    return model_fn
'''

SCRIPT = MODELS + r'''
import json, sys
import numpy as np
import tfdist
from tfdist.errors import UserError

rng = np.random.default_rng(0)
x = rng.random((256, 8), dtype=np.float32)
y = x.mean(axis=1, keepdims=True)
val = (x[:64] + 0.5, y[:64] + 0.5)
devices = ["/cpu:0", "/cpu:1"]
made = {"one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
        "mirrored": lambda: tf.distribute.MirroredStrategy(devices),
        "central_storage": lambda: tf.distribute.experimental.CentralStorageStrategy(devices)}
out = {}
models = (("lower", builder(Lower, False)), ("compiled", builder(guide_model, True)))
# Keras' own fits first, unpatched: tfdist.fit installs Keras' patch for the model it returns.
for name, model_fn in models:
    for strategy in made:
        with made[strategy]().scope():
            model = model_fn()
        out[f"{name} keras {strategy}"] = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                    validation_data=val).history
for name, model_fn in models:
    for strategy in made:
        out[f"{name} tfdist {strategy}"] = tfdist.fit(model_fn, x, y, batch_size=32, epochs=2, shuffle=False,
                                                      verbose=0, validation_data=val, strategy=strategy).history
# A step compiled with XLA, on one device (XLA has no collectives on CPU replicas), over compute_loss.
jitted = builder(guide_model, True, jit_compile=True)
out["guide_jit keras one_device"] = jitted().fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                 validation_data=val).history
out["guide_jit tfdist one_device"] = tfdist.fit(jitted, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                validation_data=val, strategy="one_device").history
try:
    tfdist.fit(builder(Misnamed, False), x, y, batch_size=32, strategy="mirrored", verbose=0)
except UserError as e:
    out["misnamed"] = str(e)
print("RESULTS " + json.dumps(out))
'''


def results() -> dict:
    return script_results("fit_custom_steps",
                          "from tfdist.strategies import setup_host\nsetup_host(cpu_devices=2)\n" + SCRIPT)


@pytest.mark.xdist_group("fit_custom_steps")
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model", ["lower", "compiled"])
def test_own_steps_equal_keras_fit_on_one_device(model, strategy):
    out = results()
    keras_history, tfdist_history = out[f"{model} keras one_device"], out[f"{model} tfdist {strategy}"]
    expected = {"loss", "mae", "val_loss", "val_mae"}
    assert set(keras_history) == expected and all(len(v) == 2 for v in keras_history.values()), keras_history
    assert spread(tfdist_history, keras_history) < 1e-6, (tfdist_history, keras_history)
    # It trains (the lower-level model has no compiled loss, and is not refused): the loss falls.
    assert tfdist_history["loss"][-1] < tfdist_history["loss"][0], tfdist_history


@pytest.mark.xdist_group("fit_custom_steps")
def test_keras_own_mirrored_fit_unpatched_reports_a_fraction_of_the_loss_that_tfdist_fit_does_not():
    out = results()
    keras_mirrored, one = out["compiled keras mirrored"], out["compiled keras one_device"]
    assert keras_mirrored["loss"][0] == pytest.approx(one["loss"][0] / 2, rel=1e-5)
    assert keras_mirrored["mae"] == pytest.approx(one["mae"], rel=1e-5)
    assert out["compiled tfdist mirrored"]["loss"] == pytest.approx(one["loss"], rel=1e-6)


@pytest.mark.xdist_group("fit_custom_steps")
def test_the_lower_level_model_trains_as_one_device_under_two_replicas():
    # Its loss is the sum of per-example losses' gradients, all-reduced: 2 replicas take one device's step.
    out = results()
    assert spread(out["lower tfdist mirrored"], out["lower tfdist one_device"]) < 1e-5


@pytest.mark.xdist_group("fit_custom_steps")
def test_a_step_compiled_with_xla_equals_keras_fit_on_one_device():
    out = results()
    assert spread(out["guide_jit tfdist one_device"], out["guide_jit keras one_device"]) < 1e-6


@pytest.mark.xdist_group("fit_custom_steps")
def test_a_step_returning_other_logs_is_one_line():
    message = results()["misnamed"]
    assert message.startswith("Invalid train_step for tfdist.fit: it returns ['batch_loss'], and model.metrics "
                              "are named ['loss', 'mae']."), message
    assert "\n" not in message
