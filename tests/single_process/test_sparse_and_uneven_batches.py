"""Sparse gradients and batches that split unevenly over replicas, against Keras' own one-device ``fit``.

One fresh process of 2 logical CPUs (``tfdist.setup("mirrored")``) trains each model with Keras' ``fit`` on one
device, then with ``tfdist.fit`` and with Keras' own ``fit`` under the set-up's strategy: an ``Embedding`` under
Adam (whose update of ``IndexedSlices`` differs from that of the same gradient made dense), under a ``clipnorm``
that clips some steps and under RMSprop with momentum, a conv net on rows whose last batch a split of the global
batch in equal halves would leave one replica nothing (8 of 64), a dense net and a conv net (with Keras' step and
with its own ``train_step``) whose last batch leaves one replica nothing whatever the split (1 of 64: that replica
adds nothing, not 0/0, and its convolution, which TensorFlow's oneDNN mis-shapes on an empty batch, is skipped).
The weights and every History entry are compared. ``RMSprop(centered=True)`` on the Embedding's sparse gradient,
whose update Keras fails on one device, is one line.

A last batch that splits unevenly (one device's mean, not a mean of the replicas' means), synchronized batch
norm, ``steps_per_execution`` and two outputs with ``loss_weights`` are cases of the check's fixed sample
(``tests/cluster/test_check.py``), in every mode and on 2 workers.
"""

from __future__ import annotations

import pytest

from helpers.clis import run_python
from helpers.outputs import tagged

SCRIPT = r'''
import json, numpy as np, tfdist
from tfdist.errors import UserError
strategy = tfdist.setup("mirrored", cpu_devices=2)
import keras

def embedding(optimizer):
    def make():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((10,), dtype="int32"), keras.layers.Embedding(60, 8),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=optimizer(), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model
    rng = np.random.default_rng(0)
    x = rng.integers(0, 60, size=(256, 10)).astype("int32")
    return make, x, ((x % 7).mean(axis=1) > 3).astype("int64")

def conv(rows):
    def make():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                                  keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
        return model
    rng = np.random.default_rng(1)
    x = rng.normal(size=(rows, 6, 6, 1)).astype("float32")
    return make, x, (x.mean(axis=(1, 2, 3)) > 0).astype("int64")

class OwnStep(keras.Model):
    """A model with its own train_step, as keras.io's examples write one."""
    def train_step(self, data):
        import tensorflow as tf
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        for metric in self.metrics:
            metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, y_pred)
        return {metric.name: metric.result() for metric in self.metrics}

def own_step_conv(rows):
    make_conv, x, y = conv(rows)
    def make():
        built = make_conv()
        model = OwnStep(built.inputs, built.outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
        return model
    return make, x, y

def dense(rows):
    def make():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model
    rng = np.random.default_rng(4)
    x = rng.normal(size=(rows, 8)).astype("float32")
    return make, x, (x.sum(axis=1) > 0).astype("int64")

# np.max, not max: a NaN anywhere is the spread (Python's max drops a NaN that is not first).
def history_spread(got, want):
    return float(np.max([abs(a - b) / max(abs(b), 1e-3) for key in want for a, b in zip(got[key], want[key])]))

def spread(a, b):
    return float(np.max([np.linalg.norm(u - v) / max(np.linalg.norm(v), 1e-12) for u, v in zip(a, b)]))

cases = {"embedding adam": embedding(lambda: keras.optimizers.Adam(0.02)),
         "embedding clipnorm": embedding(lambda: keras.optimizers.SGD(1.0, clipnorm=0.02)),
         "embedding rmsprop": embedding(lambda: keras.optimizers.RMSprop(0.01, momentum=0.5)),
         "last batch 8 of 64": conv(584), "dense, last batch 1 of 64": dense(577),
         "conv, last batch 1 of 64": conv(577), "own train_step conv, last batch 1 of 64": own_step_conv(577)}
results = {}
for name, (make, x, y) in cases.items():
    args = dict(batch_size=64, epochs=3, shuffle=False, verbose=0)
    reference = make()
    history = reference.fit(x, y, **args).history
    fitted = tfdist.fit(make, x, y, **args)
    with strategy.scope():
        keras_model = make()
    keras_history = keras_model.fit(x, y, **args).history
    results[name] = {"tfdist.fit": spread(fitted.model.get_weights(), reference.get_weights()),
                     "keras fit": spread(keras_model.get_weights(), reference.get_weights()),
                     "tfdist.fit history": history_spread(fitted.history, history),
                     "keras history": history_spread(keras_history, history)}
print("RESULTS " + json.dumps(results))

# RMSprop(centered=True) on an Embedding's sparse gradient: Keras' own update fails on one device, so one line.
make, x, y = embedding(lambda: keras.optimizers.RMSprop(0.01, centered=True))
refusals = {}
with strategy.scope():
    keras_model = make()
for name, call in {"tfdist.fit": lambda: tfdist.fit(make, x, y, batch_size=64, verbose=0),
                   "keras fit": lambda: keras_model.fit(x, y, batch_size=64, verbose=0)}.items():
    try:
        call()
        refusals[name] = "trained"
    except UserError as error:
        refusals[name] = str(error)
print("REFUSALS " + json.dumps(refusals))
'''


@pytest.mark.slow
def test_sparse_gradients_and_uneven_last_batches_train_as_one_device():
    proc = run_python(SCRIPT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = tagged(proc.stdout, "RESULTS")
    for name, row in results.items():
        assert all(v < 2e-6 for v in row.values()), (name, row)
    refusals = tagged(proc.stdout, "REFUSALS")
    assert refusals.keys() == {"tfdist.fit", "keras fit"}, refusals
    for name, line in refusals.items():
        assert line.startswith("Invalid RMSprop(centered=True)") and "\n" not in line, (name, line)
