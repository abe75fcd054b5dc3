"""``one_device.optimizer``: a Keras whose optimizer lacks a method the wrapping needs is one line; the
optimizer's XLA and EMA under ``tfdist.fit``."""

from __future__ import annotations

import pytest

from helpers.models import dense
from tfdist.errors import UserError
from tfdist.one_device import optimizer


def test_an_optimizer_without_a_wrapped_method_is_refused_in_one_line():
    from keras.optimizers import LossScaleOptimizer, Optimizer


    class StandIn:
        _apply_weight_decay = _backend_increment_gradient_accumulators = staticmethod(lambda *a: None)
        _overwrite_model_variables_with_average_value = apply = staticmethod(lambda *a: None)

    with pytest.raises(UserError, match=r"^Unsupported Keras .*StandIn\._backend_update_step") as error:
        optimizer.check(StandIn, Optimizer, LossScaleOptimizer)
    assert "\n" not in str(error.value)
    optimizer.check(Optimizer, Optimizer, LossScaleOptimizer)  # Keras' own classes pass


def test_jit_compile_is_honoured_by_tfdist_fit():
    # An op XLA cannot compile (a NumPy function) in the forward pass: with compile(jit_compile=True) the step
    # fails to compile, so a run that trains would mean XLA was ignored; without it the same model trains.
    import keras
    import numpy as np
    import tensorflow as tf

    import tfdist

    class NumpyDouble(keras.layers.Layer):
        def call(self, x):
            y = tf.numpy_function(lambda a: (2 * a).astype(np.float32), [x], tf.float32)
            return tf.ensure_shape(y, x.shape)

    def model_fn(jit):
        def build():
            model = keras.Sequential([keras.Input((4,)), NumpyDouble(), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse", jit_compile=jit)
            return model
        return build

    x, y = np.ones((16, 4), np.float32), np.ones((16, 1), np.float32)
    history = tfdist.fit(model_fn(False), x, y, batch_size=8, verbose=0, strategy="one_device")
    assert len(history.history["loss"]) == 1
    with pytest.raises(Exception, match="(?i)xla|compil|PyFunc|numpy_function"):
        tfdist.fit(model_fn(True), x, y, batch_size=8, verbose=0, strategy="one_device")


def test_a_resumed_ema_run_keeps_the_moving_averages(tmp_path):
    # The run directory's checkpoint keeps the trained weights and the averages apart: 2 epochs, then the same
    # call for 3 on that directory, ends where 3 epochs straight end (the averages finalized into the model).
    import keras
    import numpy as np

    import tfdist

    def model_fn():
        return dense(hidden=(8,), seed=3, optimizer=keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.8))

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    args = dict(batch_size=16, shuffle=False, verbose=0, strategy="one_device")
    straight = tfdist.fit(model_fn, x, y, epochs=3, model_dir=str(tmp_path / "straight"), **args).model
    tfdist.fit(model_fn, x, y, epochs=2, model_dir=str(tmp_path / "resumed"), **args)
    resumed = tfdist.fit(model_fn, x, y, epochs=3, model_dir=str(tmp_path / "resumed"), **args).model
    reference = model_fn()
    reference.fit(x, y, epochs=3, batch_size=16, shuffle=False, verbose=0)
    for got, want, keras_own in zip(resumed.get_weights(), straight.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(want, keras_own, rtol=1e-5, atol=1e-6)
