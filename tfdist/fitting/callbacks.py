"""``tfdist.fit``'s Keras callbacks: an engine hook calling every task's callbacks and ``History`` (its
``model.stop_training`` stops every task), and ``BackupAndRestore``'s backups restored as Keras' ``fit`` restores
them (the callbacks' files are the chief's alone: ``one_device.chief_files``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tfdist import _compat
from tfdist.engine.plan import Hook

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
    """Calls the ``callbacks`` as Keras' ``fit`` does, at each epoch's end and chunk.

    Attributes:
      model: the model (its ``stop_training`` stops the run on every task).
      callbacks: a ``keras.callbacks.CallbackList`` of the user's callbacks and this task's ``History`` (last),
        run on every task that runs the loop, with the same global logs (their files are the chief's:
        ``chief_only_files``); set once the loop is about to run, inside ``chief_only_files``.
      reset: resets the model's own metrics (a no-op for a compiled model's steps), before each epoch.
      epoch_steps, total_steps: the steps of an epoch and of the run.
      per_execution: the model's ``steps_per_execution``: the steps of a chunk, as Keras numbers batches.
      batch_hooks: call the callbacks' train-batch hooks at each chunk (when one has them).
      eval_reset: reset the model's own metrics before each eval pass too.
    """

    model: Any
    callbacks: Any
    reset: Callable[[], None]
    epoch_steps: int
    total_steps: int
    per_execution: int
    batch_hooks: bool
    eval_reset: bool

    def epoch_end(self, step: int, train: dict | None, evaluated: dict | None) -> bool:
        epoch, logs = step // self.epoch_steps - 1, keras_logs(train, evaluated)
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


def restore_backups(callbacks, model, *, resumed_step: int | None, epoch_steps: int,
                    wait: Callable[[], None] = lambda: None) -> int | None:
    """Restore the backup of each ``keras.callbacks.BackupAndRestore`` of ``callbacks`` into ``model``, as Keras'
    ``fit`` does at its start (the callback's ``on_train_begin``, from the backup's real path on every worker),
    unless tfdist restored a later step from its own checkpoint (``resumed_step``, None for a fresh start; a
    backup holds the weights of its epoch's start, or of a later batch of it).

    Returns the epoch Keras' ``fit`` starts at after the restore (the backup's, at its start: Keras resumes a
    backup saved within an epoch at that epoch's first batch, with the weights saved), or None (no backup).
    Call ``one_device.chief_files.chief_only_files`` with ``restored=True`` afterwards: the callbacks do not
    restore again.

    ``wait``: called once before a backup is read, where there is one to read: across workers, a barrier of
    every worker, so that none reads the chief's backup before the chief's last ``fit`` in this process has
    written it (one stopped by an exception, then called again).
    """
    import keras

    backups = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
    if backups:
        wait()
    epoch = None
    for callback in backups:
        saved = _compat.backup_epoch(callback)
        if resumed_step is not None and (saved is None or saved * epoch_steps < resumed_step):
            continue
        callback.set_model(model)
        callback.on_train_begin()
        if saved is not None:
            epoch = _compat.fit_initial_epoch(model)
    return epoch
