"""``tfdist.fit`` honours a model's own ``train_step``/``test_step``, as Keras' ``fit`` runs them.

In one fresh process (2 logical CPUs), two models of the keras.io guide
"Customizing what happens in fit()" train with Keras' own ``model.fit`` on one
device and with ``tfdist.fit``, from the same initial weights, on the same batches:

- ``Lower``: the guide's lower-level model, compiled with an optimizer only:
  its loss computed in ``train_step``, tracked by its own ``keras.metrics.Mean``,
  and its own ``test_step`` for the validation data, under ``one_device``,
  ``mirrored`` and ``central_storage``;
- ``guide_model`` (``helpers.models``): the guide's first model, ``train_step``
  over ``compute_loss`` and the compiled metrics, Keras' own ``test_step``, under
  ``mirrored`` and ``central_storage`` (under ``one_device`` and on 2 workers, the
  check's ``own_train_step`` family, in its fixed sample: ``tests/cluster/test_check.py``).

Every epoch's figures equal Keras' own ``fit`` on one device (the test allows
1e-6 relative for float rounding), ``central_storage`` too, where each replica's
metric updates add up once (``tfdist.one_device.central_storage``).
Keras' own ``MirroredStrategy`` does not for ``guide_model``: it tracks the loss
that ``compute_loss`` divided by the replicas, half of one device's, while
``tfdist.fit`` runs the step with the loss one device sees. ``guide_model``
compiled with ``jit_compile=True`` trains on one device as Keras' ``fit`` trains
it. A step that returns logs other than the model's metrics is one ``UserError``
line (``test_fit_bad_inputs.py``). The same ``Lower`` under 2
``multi_worker_mirrored`` workers is in ``test_fit_setup.py``; under
``parameter_server`` (refused) in ``test_fit_parameter_server.py``.
"""

from __future__ import annotations


import pytest

from helpers.models import source
from helpers.outputs import script_results, spread

#: ``(model, strategy)`` of each ``tfdist.fit`` run. The guide's model under ``one_device`` is the check's
#: ``own_train_step`` family (its fixed sample, ``tests/cluster/test_check.py``).
RUNS = (("lower", "one_device"), ("lower", "mirrored"), ("lower", "central_storage"), ("compiled", "mirrored"),
        ("compiled", "central_storage"))

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

rng = np.random.default_rng(0)
x = rng.random((256, 8), dtype=np.float32)
y = x.mean(axis=1, keepdims=True)
val = (x[:64] + 0.5, y[:64] + 0.5)
out = {}
lower, compiled = builder(Lower, False), builder(guide_model, True)
# Keras' own fits first, unpatched: tfdist.fit installs Keras' patch for the model it returns.
out["lower keras one_device"] = lower().fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                            validation_data=val).history
out["compiled keras one_device"] = compiled().fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                  validation_data=val).history
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    model = compiled()
out["compiled keras mirrored"] = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                           validation_data=val).history
for name, strategy in RUNS:
    out[f"{name} tfdist {strategy}"] = tfdist.fit({"lower": lower, "compiled": compiled}[name], x, y, batch_size=32,
                                                  epochs=2, shuffle=False, verbose=0, validation_data=val,
                                                  strategy=strategy).history
# A step compiled with XLA, on one device (XLA has no collectives on CPU replicas), over compute_loss.
jitted = builder(guide_model, True, jit_compile=True)
out["guide_jit keras one_device"] = jitted().fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                 validation_data=val).history
out["guide_jit tfdist one_device"] = tfdist.fit(jitted, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                                                validation_data=val, strategy="one_device").history
print("RESULTS " + json.dumps(out))
'''


def results() -> dict:
    return script_results("fit_custom_steps", "from tfdist.strategies import setup_host\nsetup_host(cpu_devices=2)\n"
                          f"RUNS = {RUNS!r}\n" + SCRIPT)


@pytest.mark.xdist_group("fit_custom_steps")
@pytest.mark.parametrize("model,strategy", RUNS)
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

