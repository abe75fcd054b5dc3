"""A case of the space made real: its data, its ``model_fn``, its callbacks and its ``fit`` arguments."""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdist.check.space import CLASSES, METRICS, OPTIMIZERS, Case

#: Rows of held-out data that ``evaluate`` and ``predict`` read after training.
HELD_OUT = 40


def data(case: Case, rows: int, offset: int = 0):
    """``(x, y)`` of ``rows`` examples for ``case``, fixed by its seed (``offset`` draws other rows)."""
    rng = np.random.default_rng([case.seed, offset])
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


def model_fn(case: Case):
    """``() -> keras.Model``: the case's model, compiled, with the same initial weights at every call."""

    def build():
        import keras

        keras.utils.set_random_seed(case.seed % 2**31)
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


def callbacks(case: Case) -> list:
    """Fresh instances of the case's callbacks (a callback keeps state across a run)."""
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


def fit_arguments(case: Case) -> tuple[object, object, dict]:
    """``(x, y, keyword arguments)`` of ``fit`` for ``case``, as Keras' ``model.fit`` and ``tfdist.fit`` take them."""
    import tensorflow as tf

    x, y = data(case, case.rows)
    kwargs = {"epochs": case.epochs, "shuffle": False, "verbose": 0, "callbacks": callbacks(case)}
    if case.dataset:
        x, y = tf.data.Dataset.from_tensor_slices((x, y)).batch(case.batch), None
    else:
        kwargs["batch_size"] = case.batch
    if case.sample_weight:
        kwargs["sample_weight"] = np.linspace(0.5, 1.5, case.rows).astype("float32")
    if case.class_weight:
        kwargs["class_weight"] = {0: 1.0, 1: 2.0, 2: 0.5}
    if case.validation == "data":
        kwargs["validation_data"] = data(case, 24, offset=1)
        if case.dataset:
            kwargs["validation_data"] = tf.data.Dataset.from_tensor_slices(kwargs["validation_data"]).batch(case.batch)
    elif case.validation == "split":
        kwargs["validation_split"] = 0.25
    if case.validation:
        kwargs["validation_freq"] = case.validation_freq
    return x, y, kwargs


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A drawn case as the runs take a setup: its ``model_fn``, ``fit`` arguments and held-out rows."""

    case: Case

    def model_fn(self):
        return model_fn(self.case)

    def fit_arguments(self):
        return fit_arguments(self.case)

    def held_out(self):
        return (*data(self.case, HELD_OUT, offset=2), self.case.batch)

    def describe(self) -> str:
        return self.case.describe()
