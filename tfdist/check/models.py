"""A case's model, compiled as the case says: its layers, optimizer, metrics and loss, with the same initial weights
at every call; the models that train on ``x`` alone (keras.io's GAN without ``call()``, an autoencoder) and the
keras.io guide's model with its own ``train_step``."""

from __future__ import annotations

from tfdist.check.space import CLASSES, METRICS, OPTIMIZERS, Case


def _optimizer(case: Case):
    import keras

    rate, _ = OPTIMIZERS[case.optimizer]
    learning_rate = keras.optimizers.schedules.ExponentialDecay(rate, decay_steps=3, decay_rate=0.5) \
        if case.schedule else rate
    options = dict(case.options)
    if case.clip:
        options[case.clip[0]] = case.clip[1]
    optimizer = getattr(keras.optimizers, case.optimizer)(learning_rate=learning_rate, **options)
    return keras.optimizers.LossScaleOptimizer(optimizer) if case.loss_scale else optimizer


def _metrics(case: Case) -> list:
    import keras

    table = dict(METRICS["sparse" if case.model == "two_outputs" else case.labels])
    made = [name if table[name] is None else _metric(getattr(keras.metrics, name), table[name])
            for name in case.metrics]
    return {"label": made} if case.model == "two_outputs" and made else made


def _metric(cls, arguments: dict):
    """A metric with its class' default name: a process that makes several gets ``precision``, not ``precision_3``,
    so every mode's History names it as the reference's does."""
    import inspect
    import re

    name = inspect.signature(cls.__init__).parameters["name"].default
    if name is None:  # Keras names it after its class, in snake case, then numbers each further one
        name = re.sub(r"([a-z])([A-Z])", r"\1_\2", re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", cls.__name__)).lower()
    return cls(name=name, **arguments)


def guide_model(inputs, outputs):
    """A model with its own ``train_step``, as Keras' "Customizing what happens in fit()" guide writes it: it
    feeds ``compute_loss`` to its own loss tracker (the tests' copy of the guide too)."""
    import keras
    import tensorflow as tf

    class GuideModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

    return GuideModel(inputs, outputs)


def gan_model():
    """keras.io's GAN: a discriminator and a generator, each with an optimizer of its own, its own ``compile``
    and ``train_step`` and no ``call()``. Its noise is drawn from the real examples (each example its own), so
    that N replicas see one device's noise."""
    import keras
    import tensorflow as tf

    ops, layers = keras.ops, keras.layers

    class GAN(keras.Model):
        def __init__(self):
            super().__init__()
            self.discriminator = keras.Sequential([keras.Input((8,)), layers.Dense(8, activation="relu"),
                                                   layers.Dense(1)])
            self.generator = keras.Sequential([keras.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(8)])
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

        def compile(self, d_optimizer, g_optimizer, loss_fn, **kwargs):
            super().compile(**kwargs)
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker]

        def train_step(self, real):
            noise = ops.tanh(real[:, :4] + real[:, 4:])
            rows = ops.shape(real)[0]
            labels = ops.concatenate([ops.ones((rows, 1)), ops.zeros((rows, 1))], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(ops.concatenate([self.generator(noise), real])))
            weights = self.discriminator.trainable_weights
            self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights))
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(ops.zeros((rows, 1)), self.discriminator(self.generator(noise)))
            weights = self.generator.trainable_weights
            self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights))
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    return GAN()


def autoencoder_model():
    """An autoencoder shaped as keras.io's VAE: ``fit(x)`` with no targets, its own ``train_step`` and loss
    trackers, a loss summed over features and averaged over the batch; compiled with ``mse`` for ``evaluate``."""
    import keras
    import tensorflow as tf

    ops, layers = keras.ops, keras.layers

    class AutoEncoder(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder, self.decoder = layers.Dense(3, activation="tanh"), layers.Dense(8)
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")

        def call(self, x):
            return self.decoder(self.encoder(x))

        @property
        def metrics(self):
            return [self.total_loss_tracker, self.reconstruction_loss_tracker]

        def train_step(self, x):
            with tf.GradientTape() as tape:
                code = self.encoder(x)
                reconstruction = ops.mean(ops.sum(ops.square(x - self.decoder(code)), axis=1))
                total = reconstruction + 0.01 * ops.mean(ops.sum(ops.square(code), axis=1))
            self.optimizer.apply(tape.gradient(total, self.trainable_weights), self.trainable_weights)
            self.total_loss_tracker.update_state(total)
            self.reconstruction_loss_tracker.update_state(reconstruction)
            return {m.name: m.result() for m in self.metrics}

    model = AutoEncoder()
    model(keras.Input((8,)))
    return model


def model_fn(case: Case):
    """``() -> keras.Model``: the case's model, compiled, with the same initial weights at every call."""

    def build():
        import keras

        keras.utils.set_random_seed(case.seed % 2**31)
        if case.model == "gan":
            model = gan_model()
            model.compile(d_optimizer=_optimizer(case), g_optimizer=_optimizer(case),
                          loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
                          steps_per_execution=case.steps_per_execution)
            return model
        if case.model == "autoencoder":
            model = autoencoder_model()
            model.compile(optimizer=_optimizer(case), loss="mse", steps_per_execution=case.steps_per_execution)
            return model
        previous = keras.mixed_precision.global_policy()
        if case.mixed_precision:
            keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = _layers(case)
        finally:
            keras.mixed_precision.set_global_policy(previous)
        losses = {"sparse": "sparse_categorical_crossentropy", "onehot": "categorical_crossentropy",
                  "value": "mse"}
        if case.model == "two_outputs":
            loss = {"label": "sparse_categorical_crossentropy", "value": "mse"}
            extra = {"loss_weights": {"label": 1.0, "value": 0.3}}
        else:
            loss, extra = losses[case.labels], {}
        model.compile(optimizer=_optimizer(case), loss=loss, metrics=_metrics(case),
                      steps_per_execution=case.steps_per_execution, jit_compile=case.jit_compile, **extra)
        return model

    return build


def _layers(case: Case):
    import keras

    layers = keras.layers
    width = 1 if case.labels == "value" else CLASSES
    head = layers.Dense(width, activation=None if case.labels == "value" else "softmax", dtype="float32")
    if case.model == "dict_inputs":
        a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
        hidden = layers.Dense(8, activation="relu")(layers.Concatenate()([a, b]))
        return keras.Model({"a": a, "b": b}, head(hidden))
    if case.model == "embedding":
        inputs = keras.Input((6,), dtype="int32")
        hidden = layers.GlobalAveragePooling1D()(layers.Embedding(50, 8)(inputs))
    elif case.model == "conv":
        inputs = keras.Input((6, 6, 1))
        hidden = layers.Flatten()(layers.Conv2D(4, 3, activation="relu")(inputs))
    else:
        inputs = keras.Input((8,))
        hidden = layers.Dense(8, activation="relu")(inputs)
        if case.model == "synchronized_bn":
            hidden = layers.BatchNormalization(synchronized=True)(hidden)
    if case.model == "two_outputs":
        return keras.Model(inputs, {"label": layers.Dense(CLASSES, activation="softmax", name="label")(hidden),
                                    "value": layers.Dense(1, name="value")(hidden)})
    if case.model == "own_train_step":
        return guide_model(inputs, head(hidden))
    return keras.Model(inputs, head(hidden))
