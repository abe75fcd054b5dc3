"""The tests' tiny Keras models: a small dense model (``dense``), and the keras.io guide's model with its own
``train_step`` (``guide_model``).

A test imports them. A script that a test runs in a fresh process starts with ``source()``, this module's text:
the child's ``sys.path`` lacks ``tests/``. Keras is imported when a model is made, so such a script may set its
process up (``tfdist.setup``) after these definitions.
"""

from pathlib import Path


def source() -> str:
    """This module's text, for a script run in a fresh process to start with (it only defines functions)."""
    return Path(__file__).read_text()


def dense(inputs: int = 4, outputs: int = 1, *, hidden=(), activation="relu", output_activation=None, seed=None,
          compiled: bool = True, optimizer="sgd", loss="mse", **compile_args):
    """A ``Sequential`` of ``inputs`` features -> a ``Dense`` layer of each width in ``hidden`` (``activation``)
    -> ``Dense(outputs, output_activation)``, compiled with ``optimizer``, ``loss`` and ``compile_args``
    (``metrics``, ``jit_compile``, ...) unless ``compiled`` is False; ``seed``: Keras' seed, set first, so that
    every call starts from the same weights."""
    import keras

    if seed is not None:
        keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(width, activation=activation) for width in hidden]
    model = keras.Sequential([keras.Input((inputs,)), *layers, keras.layers.Dense(outputs, activation=output_activation)])
    if compiled:
        model.compile(optimizer=optimizer, loss=loss, **compile_args)
    return model


def guide_model(inputs, outputs):
    """A functional model of ``inputs`` and ``outputs`` with its own ``train_step``, the first model of Keras'
    guide "Customizing what happens in fit()": its loss from ``compute_loss``, fed with the targets to the
    compiled metrics (the loss tracker takes the loss); Keras' own ``test_step``."""
    import keras
    import tensorflow as tf

    class GuideModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    return GuideModel(inputs, outputs)


def autoencoder(features: int = 8, code: int = 3, *, mean: bool = False, seed: int = 1, learning_rate: float = 0.01):
    """keras.io's VAE shape, made plain: trained by ``fit(x)`` with no ``y``, its loss and two ``Mean`` trackers
    in its own ``train_step``, compiled with a loss (``"mse"``) that step never calls; SGD. Its loss is per
    example (a vector, which a gradient tape sums), or with ``mean`` the batch's mean (a scalar, as the keras.io
    VAE's)."""
    import keras
    import tensorflow as tf
    from keras import ops

    class AutoEncoder(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder = keras.layers.Dense(code, activation="tanh")
            self.decoder = keras.layers.Dense(features)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.code_tracker = keras.metrics.Mean(name="code")

        @property
        def metrics(self):
            return [self.loss_tracker, self.code_tracker]

        def call(self, x):
            return self.decoder(self.encoder(x))

        def train_step(self, x):
            with tf.GradientTape() as tape:
                encoded = self.encoder(x)
                penalty = 0.01 * ops.sum(ops.square(encoded), axis=1)
                loss = ops.sum(ops.square(x - self.decoder(encoded)), axis=1) + penalty
                if mean:
                    loss = ops.mean(loss)
            grads = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply(grads, self.trainable_weights)
            self.loss_tracker.update_state(loss)
            self.code_tracker.update_state(penalty)
            return {m.name: m.result() for m in self.metrics}

    keras.utils.set_random_seed(seed)
    model = AutoEncoder()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
    return model
