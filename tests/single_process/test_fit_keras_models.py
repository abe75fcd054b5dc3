"""``tfdist.fit`` and Keras' own ``fit`` after ``tfdist.setup`` take the models and inputs Keras' ``fit`` takes on
one device, and build a model from the type of its data, never from a batch of it.

In one fresh process (2 logical CPUs), each case trains with Keras' own ``fit`` on one device, then with
``tfdist.fit`` under ``one_device``, ``mirrored`` and ``central_storage``, then with Keras' own ``fit`` under
``tfdist.setup("mirrored")``; each equals the first (losses and final weights, to the float32 noise floor):

- ``gan arrays``: the keras.io GAN's shape, a model without ``call()``, its parts without an ``Input``, two
  optimizers (Adam and Nadam, whose ``u_product`` is a trainable variable made as the traced step applies it), a
  ``keras.random.SeedGenerator`` drawn in the step (weighed 0, so that every mode sees the same numbers), its own
  ``train_step`` over the real images alone (numpy ``x`` without ``y``);
- ``vae arrays``: the keras.io VAE's shape, no ``call()``, ``fit(x)`` without ``y``, its own trackers;
- ``reshuffled``: a Dataset that reshuffles each iteration, over 3 epochs: each epoch is the order Keras' sees
  (a batch read before training would start its first iteration; Keras' fit makes an iterator it does not read
  between two epochs, so its epoch k sees the Dataset's order 2k-1);
- ``generator``: a ``Dataset.from_generator`` that counts its starts: training starts it once, as Keras' does.

The GAN on a Dataset of images alone, and an autoencoder whose own ``train_step`` feeds the batch's mean loss (a
scalar Keras does not scale) to a ``keras.metrics.Mean`` on a last batch that splits unevenly, are cases of the
check's fixed sample (``tests/cluster/test_check.py``: both fits, one process and 2 workers).

A compiled model's loss without targets (``fit(x)``) is one line, as Keras' own ``fit`` fails on it too.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.models import source
from helpers.outputs import script_results, spread

SCRIPT = r'''
import json

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

import tfdist
from tfdist.errors import UserError


class GAN(keras.Model):
    """The keras.io GAN's shape: no call(), two optimizers, its data the real images alone. Its latent points
    are a fixed function of the images (not random draws), so that one device and N replicas see the same."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)  # its integer state advances in every step

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        flat = ops.reshape(real_images, (-1, 16))
        generated = self.generator(ops.sin(7.0 * flat[:, :self.latent_dim]))
        combined = ops.concatenate([generated, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        labels += 0.0 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            fake = self.discriminator(self.generator(ops.cos(5.0 * flat[:, :self.latent_dim])))
            g_loss = self.loss_fn(ops.zeros((batch_size, 1)), fake)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


def gan_fn():
    keras.utils.set_random_seed(0)
    discriminator = keras.Sequential([layers.Flatten(), layers.Dense(8, activation="relu"), layers.Dense(1)],
                                     name="discriminator")
    generator = keras.Sequential([layers.Dense(8, activation="relu"), layers.Dense(16), layers.Reshape((4, 4, 1))],
                                 name="generator")
    gan = GAN(discriminator, generator, latent_dim=4)
    gan.compile(keras.optimizers.Adam(1e-2), keras.optimizers.Nadam(1e-2),
                keras.losses.BinaryCrossentropy(from_logits=True))
    return gan


class VAE(keras.Model):
    """The keras.io VAE's shape: no call(), fit(x) without y, its own loss trackers. Its code is the mean (no
    random draw), and its loss a keras.losses.Loss, which Keras scales over replicas."""

    def __init__(self):
        super().__init__()
        self.encoder = keras.Sequential([layers.Dense(8, activation="relu"), layers.Dense(4)], name="encoder")
        self.decoder = keras.Sequential([layers.Dense(8, activation="relu"), layers.Dense(8)], name="decoder")
        self.reconstruction = keras.losses.MeanSquaredError()
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var = ops.split(self.encoder(data), 2, axis=-1)
            reconstruction = self.decoder(z_mean)
            kl = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = keras.losses.MeanAbsoluteError()(ops.zeros_like(kl), kl)
            total = self.reconstruction(data, reconstruction) + kl_loss
        grads = tape.gradient(total, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"total_loss": self.total_loss_tracker.result(), "kl_loss": self.kl_loss_tracker.result()}


def vae_fn():
    keras.utils.set_random_seed(0)
    vae = VAE()
    vae.compile(optimizer=keras.optimizers.Adam(1e-2))
    return vae


def dense_fn():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), layers.Dense(8, activation="relu"), layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


rng = np.random.default_rng(0)
images = rng.random((128, 4, 4, 1), dtype=np.float32)
rows = rng.random((128, 8), dtype=np.float32)
targets = rows.mean(axis=1, keepdims=True)
started = []


def counted():
    """Rows of (x, y) from a generator that records each start."""
    started.append(1)
    for i in range(0, 256, 32):  # 8 batches: more than 2 epochs of 2 steps take, prefetching included
        yield rows[i % 128:i % 128 + 32], targets[i % 128:i % 128 + 32]


def reshuffled():
    keras.utils.set_random_seed(0)
    return tf.data.Dataset.from_tensor_slices((rows, targets)).shuffle(
        128, seed=1, reshuffle_each_iteration=True).batch(32)


def generated():
    spec = (tf.TensorSpec((None, 8), tf.float32), tf.TensorSpec((None, 1), tf.float32))
    return tf.data.Dataset.from_generator(counted, output_signature=spec)


# name: (model_fn, x, fit's other arguments)
CASES = {
    "gan arrays": (gan_fn, lambda: images, {"batch_size": 32}),
    "vae arrays": (vae_fn, lambda: rows, {"batch_size": 32}),
    "reshuffled": (dense_fn, reshuffled, {"epochs": 3}),
    "generator": (dense_fn, generated, {"steps_per_epoch": 2}),
}


def weights(model):
    return [w.tolist() for w in model.get_weights()]


def result(history, model):
    result = {"history": history, "weights": weights(model), "generator starts": len(started)}
    started.clear()
    return result


out = {}
for name, (model_fn, x, kwargs) in CASES.items():  # Keras' own fit on one device, the reference
    model = model_fn()
    history = model.fit(x(), **{"epochs": 2, "shuffle": False, "verbose": 0, **kwargs}).history
    out[f"{name} keras one_device"] = result(history, model)
for strategy in ("one_device", "mirrored", "central_storage"):
    for name, (model_fn, x, kwargs) in CASES.items():
        fitted = tfdist.fit(model_fn, x(), **{"epochs": 2, "shuffle": False, "verbose": 0, "strategy": strategy,
                                              **kwargs})
        out[f"{name} tfdist {strategy}"] = result(fitted.history, fitted.model)
try:
    tfdist.fit(dense_fn, rows, batch_size=32, strategy="one_device", verbose=0)
except UserError as e:
    out["compiled loss without y"] = str(e)
strategy = tfdist.setup("mirrored")  # Keras' own fit after the set-up (the host has its 2 logical CPUs)
for name, (model_fn, x, kwargs) in CASES.items():
    with strategy.scope():
        model = model_fn()
    history = model.fit(x(), **{"epochs": 2, "shuffle": False, "verbose": 0, **kwargs}).history
    out[f"{name} keras_after_setup mirrored"] = result(history, model)
print("RESULTS " + json.dumps(out))
'''

CASES = ("gan arrays", "vae arrays", "reshuffled", "generator")
MODES = ("tfdist one_device", "tfdist mirrored", "tfdist central_storage", "keras_after_setup mirrored")


def results() -> dict:
    return script_results("fit_keras_models",
                          "from tfdist.strategies import setup_host\nsetup_host(cpu_devices=2)\n" + source() + SCRIPT)


@pytest.mark.xdist_group("fit_keras_models")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_trains_as_keras_fit_on_one_device(case, mode):
    out = results()
    expected, found = out[f"{case} keras one_device"], out[f"{case} {mode}"]
    assert spread(found["history"], expected["history"]) < 1e-6, (found["history"], expected["history"])
    for got, want in zip(found["weights"], expected["weights"], strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6)


@pytest.mark.xdist_group("fit_keras_models")
@pytest.mark.parametrize("mode", ("keras one_device", *MODES))
def test_a_stateful_dataset_is_started_only_by_training(mode):
    # The generator holds more batches than the run takes: one start, the one training makes.
    assert results()[f"generator {mode}"]["generator starts"] == 1


@pytest.mark.xdist_group("fit_keras_models")
def test_a_compiled_loss_without_targets_is_one_line_naming_the_input():
    message = results()["compiled loss without y"]
    assert message.startswith("Missing `y` for this model's compiled loss: it compares targets with the model's "
                              "outputs. Received: `x` as numpy x without y."), message
    assert "\n" not in message
