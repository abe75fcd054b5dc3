"""Keras' own ``fit`` after ``tfdist.patch_keras()`` over 2 replicas (``MirroredStrategy`` on the 2 logical CPUs)
trains, for the inputs Keras' data adapters take, what Keras' own ``fit`` trains on one device, in one process:

- ``x`` alone (a NumPy array, a Dataset of single tensors) for an autoencoder whose own ``train_step`` computes
  its loss from ``x``, compiled with a loss it never calls (``helpers.models.autoencoder``; ``keras_fit.x_alone``),
  per example or as the batch's mean (a scalar loss: ``one_device.shares`` weighs its gradients by the replica's
  share of the examples, where Keras' own ``MirroredStrategy`` sums the replicas' means);
- a Python generator with ``steps_per_epoch`` (from epoch 0 and from ``initial_epoch=1``) and a ``PyDataset``
  with ``shuffle=True``: the batches reach the steps in one device's order (the model is built before training
  without reading a batch, which would start an iteration of the data: a generator read ahead, a shuffle drawn).

``predict_on_batch`` gives one device's rows (each replica predicts its slice of the batch).

Each epoch's losses agree to 1e-6 relative and the final weights to 2e-7 (float32 rounding between 1 and 2
replicas: ~6e-8 here); a wrong order is 1e-3 to 1e-1 off.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from helpers.models import autoencoder

ROWS, BATCH = 96, 32
LOSS_RTOL, WEIGHT_ATOL = 1e-6, 2e-7
X = np.random.default_rng(0).normal(size=(ROWS, 8)).astype("float32")
Y = (X[:, :4].sum(axis=1) > 0).astype("int64")


def classifier():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    return model


def batch(i):
    return X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH]


def generator():
    while True:
        yield from (batch(i) for i in range(ROWS // BATCH))


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return ROWS // BATCH

    def __getitem__(self, i):
        return batch(i)


#: name: (model_fn, inputs: () -> (args, fit kwargs)); each call of inputs makes them afresh.
CASES = {
    "x_alone_numpy": (autoencoder, lambda: ((X,), dict(batch_size=16, shuffle=False))),
    "x_alone_dataset": (autoencoder, lambda: ((tf.data.Dataset.from_tensor_slices(X).batch(16),), {})),
    "x_alone_mean_loss": (functools.partial(autoencoder, mean=True), lambda: ((X,), dict(batch_size=16,
                                                                                       shuffle=False))),
    "generator": (classifier, lambda: ((generator(),), dict(steps_per_epoch=ROWS // BATCH))),
    "generator_initial_epoch": (classifier, lambda: ((generator(),), dict(steps_per_epoch=ROWS // BATCH,
                                                                          initial_epoch=1))),
    "pydataset_shuffle": (classifier, lambda: ((Batches(),), dict(shuffle=True))),
}


#: One strategy for every case: its collectives' keys count on across the fits of the module.
mirrored = functools.cache(lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))


def trained(model_fn, inputs, strategy=None):
    """``(history, weights)`` of Keras' own ``fit`` for 3 epochs, under ``strategy``'s scope where one is given."""
    args, kwargs = inputs()
    if strategy is None:
        model = model_fn()
    else:
        with strategy.scope():
            model = model_fn()
    history = model.fit(*args, epochs=3, verbose=0, **kwargs)
    return history.history, model.get_weights()


@pytest.mark.parametrize("name", CASES)
def test_keras_fit_after_patch_keras_on_two_replicas_equals_one_device(name):
    tfdist.patch_keras()
    model_fn, inputs = CASES[name]
    one, one_weights = trained(model_fn, inputs)
    two, two_weights = trained(model_fn, inputs, mirrored())
    assert two.keys() == one.keys()
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=LOSS_RTOL, err_msg=key)
    for a, b in zip(two_weights, one_weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=WEIGHT_ATOL)


@pytest.mark.parametrize("rows", [3, 32])
def test_predict_on_batch_over_two_replicas_gives_one_device_rows(rows):
    tfdist.patch_keras()
    one = classifier()
    with mirrored().scope():
        two = classifier()
    want, got = one.predict_on_batch(X[:rows]), two.predict_on_batch(X[:rows])
    assert got.shape == want.shape == (rows, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=WEIGHT_ATOL)


def test_a_users_dataset_is_copied_over_replicas_where_it_runs_python():
    # Dataset.from_generator's tensors may share a generator's arrays, which a replica's step may write into.
    from tfdist.keras_fit.owned_batches import runs_python

    rows = np.zeros((8, 2), np.float32)
    spec = tf.TensorSpec((2,), tf.float32)
    assert runs_python(tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=spec).batch(4))
    assert runs_python(tf.data.Dataset.from_tensor_slices(rows).map(
        lambda r: tf.numpy_function(lambda a: a * 2, [r], tf.float32)))
    assert not runs_python(tf.data.Dataset.from_tensor_slices(rows).map(lambda r: r * 2).batch(4))
