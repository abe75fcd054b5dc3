"""A case of the space made real: its data, its ``model_fn``, its callbacks and its ``fit`` arguments."""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from tfdist.check.space import CLASSES, METRICS, OPTIMIZERS, Case

#: Rows of held-out data that ``evaluate`` and ``predict`` read after training.
HELD_OUT = 40


def data(case: Case, rows: int, offset: int = 0):
    """``(x, y)`` of ``rows`` examples for ``case``, fixed by its seed (``offset`` draws other rows)."""
    rng = np.random.default_rng([case.seed, offset])
    if case.x_alone:
        return rng.normal(size=(rows, 8)).astype("float32"), None
    if case.model == "embedding":
        x = rng.integers(0, 50, size=(rows, 6)).astype("int32")
        score = (x % 7).mean(axis=1) - 3.0
    elif case.model == "conv":
        x = rng.normal(size=(rows, 6, 6, 1)).astype("float32")
        score = x[:, :3].mean(axis=(1, 2, 3)) * 3
    elif case.model == "dict_inputs":
        x = {"a": rng.normal(size=(rows, 4)).astype("float32"), "b": rng.normal(size=(rows, 3)).astype("float32")}
        score = x["a"][:, 0] + x["b"].sum(axis=1)
    else:
        x = rng.normal(size=(rows, 8)).astype("float32")
        score = x[:, :4].sum(axis=1)
    label = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3])).astype("int64")
    value = (0.5 * score + 0.1 * rng.normal(size=rows)).astype("float32")[:, None]
    if case.model == "two_outputs":
        return x, {"label": label, "value": value}
    return x, {"sparse": label, "onehot": np.eye(CLASSES, dtype="float32")[label], "value": value}[case.labels]


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


class Interrupted(Exception):
    """What stops the first ``fit`` of a resumed case, as a crash would."""


def callbacks(case: Case, directory: str | None = None, *, interrupt: bool = False) -> list:
    """Fresh instances of the case's callbacks (a callback keeps state across a run); those that write files
    write under ``directory``; ``interrupt``: the first ``fit`` of a resumed case, stopped after its first epoch."""
    import keras

    made = _watcher(case, directory) if case.watcher else []
    if interrupt:
        class Interrupt(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch > case.initial_epoch:
                    raise Interrupted(f"stopped at the beginning of epoch {epoch}")

        made.append(Interrupt())
    return _changer(case) + made


def _watcher(case: Case, directory: str | None) -> list:
    """The case's callback of ``WATCHERS``, writing under ``directory``."""
    import keras

    monitor = {"gan": "d_loss", "autoencoder": "total_loss"}.get(case.model, "loss")
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    if case.watcher == "TensorBoard":
        return [keras.callbacks.TensorBoard(log_dir=path("tensorboard"))]
    if case.watcher == "ModelCheckpoint":
        weights_only = case.x_alone  # a subclassed model without get_config saves its weights
        name = "best.weights.h5" if weights_only else "best.keras"
        return [keras.callbacks.ModelCheckpoint(path(name), monitor=monitor, mode="min", save_best_only=True,
                                                save_weights_only=weights_only)]
    if case.watcher == "CSVLogger":
        return [keras.callbacks.CSVLogger(path("log.csv"))]
    if case.watcher == "BackupAndRestore":
        return [keras.callbacks.BackupAndRestore(path("backup"))]
    if case.watcher == "TerminateOnNaN":
        return [keras.callbacks.TerminateOnNaN()]
    if case.watcher == "LambdaCallback":
        return [keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None,
                                               on_train_batch_end=lambda batch, logs: None)]
    return [keras.callbacks.ProgbarLogger()]


def _changer(case: Case) -> list:
    """The case's callback of ``CALLBACKS``: one that changes what trains."""
    import keras

    if case.callback is None:
        return []
    if case.callback == "ReduceLROnPlateau":
        return [keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=0.05)]
    if case.callback == "LearningRateScheduler":
        return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch else lr)]
    if case.callback == "EarlyStopping":
        return [keras.callbacks.EarlyStopping(monitor="loss", min_delta=0.05, patience=0, restore_best_weights=True)]

    class SetRate(keras.callbacks.Callback):  # a user's own: it sets the optimizer's rate at each epoch
        def on_epoch_begin(self, epoch, logs=None):
            rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            self.model.optimizer.learning_rate = rate * (0.7 if epoch else 1)

    return [SetRate()]


def _batches(case: Case, x, y):
    """``x`` and ``y`` as the case's input kind takes them: ``(x, y, fit's batch arguments)``."""
    import keras
    import tensorflow as tf

    if case.dataset:
        return tf.data.Dataset.from_tensor_slices(x if y is None else (x, y)).batch(case.batch), None, {}
    if case.source == "numpy":
        return x, y, {"batch_size": case.batch}
    rows = len(y) if not isinstance(y, dict) else len(next(iter(y.values())))
    steps = math.ceil(rows / case.batch)

    def batch(i):
        cut = slice(i * case.batch, (i + 1) * case.batch)
        return tf.nest.map_structure(lambda a: a[cut], x), tf.nest.map_structure(lambda a: a[cut], y)

    if case.source == "generator":
        def batches():
            while True:
                yield from (batch(i) for i in range(steps))

        return batches(), None, {"steps_per_epoch": steps}

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return steps

        def __getitem__(self, i):
            return batch(i)

    return Batches(workers=1 + case.seed % 2, use_multiprocessing=False), None, {}


def fit_arguments(case: Case, directory: str | None = None, *, interrupt: bool = False) -> tuple[object, object, dict]:
    """``(x, y, keyword arguments)`` of ``fit`` for ``case``, as Keras' ``model.fit`` and ``tfdist.fit`` take them;
    callbacks that write files write under ``directory``; ``interrupt``: the first ``fit`` of a resumed case."""
    import tensorflow as tf

    x, y = data(case, case.rows)
    kwargs = {"epochs": case.epochs, "shuffle": case.shuffle, "verbose": 0,
              "callbacks": callbacks(case, directory, interrupt=interrupt)}
    if case.initial_epoch:
        kwargs["initial_epoch"] = case.initial_epoch
    x, y, batching = _batches(case, x, y)
    kwargs.update(batching)
    if case.sample_weight:
        kwargs["sample_weight"] = np.linspace(0.5, 1.5, case.rows).astype("float32")
    if case.class_weight:
        kwargs["class_weight"] = {0: 1.0, 1: 2.0, 2: 0.5}
    if case.validation == "data":
        kwargs["validation_data"] = data(case, 24, offset=1)
        if case.dataset:
            kwargs["validation_data"] = tf.data.Dataset.from_tensor_slices(kwargs["validation_data"]).batch(case.batch)
        elif case.source == "pydataset":
            kwargs["validation_data"] = _batches(case, *kwargs["validation_data"])[0]
    elif case.validation == "split":
        kwargs["validation_split"] = 0.25
    if case.validation:
        kwargs["validation_freq"] = case.validation_freq
    return x, y, kwargs


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A drawn case as the runs take a setup: its ``model_fn``, ``fit`` arguments and held-out rows."""

    case: Case

    @property
    def attempts(self) -> int:
        """The ``fit`` calls of a run: two for a resumed case (the first stopped by ``Interrupted``)."""
        return 2 if self.case.resumed else 1

    def model_fn(self):
        return model_fn(self.case)

    def fit_arguments(self, directory: str | None = None, attempt: int = 0):
        return fit_arguments(self.case, directory, interrupt=attempt + 1 < self.attempts)

    def held_out(self):
        x, y = data(self.case, HELD_OUT, offset=2)
        return x, (x if self.case.model == "autoencoder" else y), self.case.batch

    def after_training(self, model) -> dict | None:
        """What a model without ``call()`` gives after training (each net's outputs), else None: the runs'
        ``evaluate`` and ``predict``."""
        if self.case.model != "gan":
            return None
        import keras

        x, _ = data(self.case, HELD_OUT, offset=2)
        noise = keras.ops.tanh(x[:, :4] + x[:, 4:])
        return {"evaluate": {}, "predict": [np.asarray(model.generator.predict(noise, verbose=0)),
                                            np.asarray(model.discriminator.predict(x, verbose=0))]}

    def describe(self) -> str:
        return self.case.describe()
