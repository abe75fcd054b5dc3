"""Keras' callbacks as an engine hook: every task's ``History``, the chief's callbacks, ``model.stop_training``."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tfdist.engine.task import Hook

#: Keys of a train or eval result that are not Keras logs.
NOT_LOGGED = ("examples", "examples_per_second", "learning_rate")


def implements_batch_hooks(callback) -> bool:
    """Whether a Keras callback overrides a train-batch hook of ``keras.callbacks.Callback`` (a progress bar does)."""
    import keras

    return any(getattr(type(callback), name) is not getattr(keras.callbacks.Callback, name)
               for name in ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end"))


def keras_logs(train: dict | None, evaluated: dict | None) -> dict:
    """Keras' epoch logs: the train metrics, and the eval ones as ``val_*``."""
    logs = {k: v for k, v in (train or {}).items() if k not in NOT_LOGGED}
    logs.update({f"val_{k}": v for k, v in (evaluated or {}).items() if k not in NOT_LOGGED})
    return logs


@dataclasses.dataclass(eq=False)
class KerasCallbacks(Hook):
    """Calls ``history`` and the chief's ``callbacks`` as Keras' ``fit`` does, at each epoch's end and chunk.

    Attributes:
      model: the model (its ``stop_training`` stops the run on every task).
      history: this task's ``keras.callbacks.History``.
      callbacks: the chief's ``keras.callbacks.CallbackList`` (empty elsewhere).
      reset: resets the model's own metrics (a no-op for a compiled model's steps), before each epoch.
      epoch_steps, total_steps: the steps of an epoch and of the run.
      per_execution: the model's ``steps_per_execution``: the steps of a chunk, as Keras numbers batches.
      batch_hooks: call the callbacks' train-batch hooks at each chunk (the chief, when one has them).
      eval_reset: reset the model's own metrics before each eval pass too.
    """

    model: Any
    history: Any
    callbacks: Any
    reset: Callable[[], None]
    epoch_steps: int
    total_steps: int
    per_execution: int
    batch_hooks: bool
    eval_reset: bool

    def epoch_end(self, step: int, train: dict | None, evaluated: dict | None) -> bool:
        epoch, logs = step // self.epoch_steps - 1, keras_logs(train, evaluated)
        self.history.on_epoch_end(epoch, logs)
        self.callbacks.on_epoch_end(epoch, logs)
        stop = bool(getattr(self.model, "stop_training", False))
        if not stop and step < self.total_steps:
            self.reset()
            self.callbacks.on_epoch_begin(epoch + 1)
        return stop

    def eval_begin(self) -> None:
        if self.eval_reset:
            self.reset()

    # The chunks are Keras' executions (steps_per_execution steps, fewer at an epoch's end); as Keras numbers
    # them, an execution begins at its first batch of the epoch and ends at that + steps_per_execution - 1,
    # with the epoch's logs so far.
    def chunk_begin(self, step: int, end: int) -> None:
        if self.batch_hooks:
            self.callbacks.on_train_batch_begin(step % self.epoch_steps)

    def chunk_end(self, step: int, end: int, window: dict) -> None:
        if self.batch_hooks:
            self.callbacks.on_train_batch_end(step % self.epoch_steps + self.per_execution - 1,
                                              keras_logs(window, None))
