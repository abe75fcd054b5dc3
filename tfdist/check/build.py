"""A case of the space made real: its data, its ``model_fn``, its callbacks and its ``fit`` arguments."""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from tfdist.check.models import model_fn
from tfdist.check.space import CLASSES, Case

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
