"""Keras' callbacks across workers: an engine hook calling every task's callbacks and ``History`` (its
``model.stop_training`` stops every task), and the file-writing callbacks' outputs kept the chief's alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from typing import Any, Callable

from tfdist import _compat
from tfdist.engine.plan import Hook
from tfdist.runtime.placement import Placement

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


def inside(directory: str, path: str) -> str:
    """``path``'s last component (a file or a directory) placed inside ``directory``."""
    return os.path.join(directory, os.path.basename(os.path.normpath(str(path))) or "files")


def _redirect(callback, directory: str, *, restored: bool) -> list[tuple[object, str, object]]:
    """Point ``callback``'s outputs into ``directory`` (a ``RemoteMonitor`` posts nothing); returns ``(object,
    attribute, old value)`` to restore.

    ``restored``: a ``BackupAndRestore`` restored its backup already (``restore_backups``), so its paths move now;
    else it restores from the real backup in its ``on_train_begin`` (every worker resumes from the same state),
    and they move after."""
    import keras

    changed = []

    def move(obj, attribute, value):
        changed.append((obj, attribute, getattr(obj, attribute)))
        setattr(obj, attribute, value)

    def move_backup():
        private = inside(directory, callback.backup_dir)
        move(callback, "backup_dir", private)
        for attribute in _compat.BACKUP_PATHS:
            move(callback, attribute, inside(private, getattr(callback, attribute)))

    if isinstance(callback, keras.callbacks.ModelCheckpoint):
        move(callback, "filepath", inside(directory, callback.filepath))
    elif isinstance(callback, keras.callbacks.TensorBoard):
        move(callback, "log_dir", inside(directory, callback.log_dir))
    elif isinstance(callback, keras.callbacks.CSVLogger):
        move(callback, "filename", inside(directory, callback.filename))
    elif isinstance(callback, keras.callbacks.RemoteMonitor):
        move(callback, "on_epoch_end", _nothing)  # it posts each epoch's logs: the chief's post alone
    elif isinstance(callback, keras.callbacks.BackupAndRestore) and restored:
        move_backup()
    elif isinstance(callback, keras.callbacks.BackupAndRestore):
        restore = callback.on_train_begin

        def on_train_begin(logs=None):
            restore(logs)
            move_backup()

        move(callback, "on_train_begin", on_train_begin)
    return changed


def restore_backups(callbacks, model, *, resumed_step: int | None, epoch_steps: int,
                    wait: Callable[[], None] = lambda: None) -> int | None:
    """Restore the backup of each ``keras.callbacks.BackupAndRestore`` of ``callbacks`` into ``model``, as Keras'
    ``fit`` does at its start (the callback's ``on_train_begin``, from the backup's real path on every worker),
    unless tfdist restored a later step from its own checkpoint (``resumed_step``, None for a fresh start; a
    backup holds the weights of its epoch's start, or of a later batch of it).

    Returns the epoch Keras' ``fit`` starts at after the restore (the backup's, at its start: Keras resumes a
    backup saved within an epoch at that epoch's first batch, with the weights saved), or None (no backup).
    Call ``chief_only_files`` with ``restored=True`` afterwards: the callbacks do not restore again.

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


def around(model, arguments, placement):
    """One Keras ``fit`` across workers (``placement``): ``chief_only_files`` of its callbacks."""
    if placement is None:
        return contextlib.nullcontext()
    return chief_only_files(list(arguments.get("callbacks") or []), placement)


def _nothing(*args, **kwargs) -> None:
    """A callback's hook that does nothing here: a ``BackupAndRestore``'s ``on_train_begin`` once
    ``restore_backups`` has restored it, a ``RemoteMonitor``'s post on a worker that is not the chief."""


@contextlib.contextmanager
def chief_only_files(callbacks, placement: Placement, *, restored: bool = False):
    """While ``fit`` runs: on a worker that is not the chief, the callbacks write into a temporary directory
    (removed after). Enter it before the callbacks get their model: ``TensorBoard`` fixes its writers' paths (and
    writes the model's graph) in ``set_model``.

    ``restored``: ``restore_backups`` restored the ``BackupAndRestore`` callbacks' backups (``tfdist.fit``), so
    their ``on_train_begin`` restores nothing again, on every worker; else it restores from the chief's backup, as
    Keras' ``fit`` calls it.
    """
    import keras

    changed: list[tuple[object, str, object]] = []
    directory = None if placement.is_chief else tempfile.mkdtemp(prefix=f"tfdist-{placement.task.slug}-")
    try:
        for callback in callbacks:
            if restored and isinstance(callback, keras.callbacks.BackupAndRestore):
                changed.append((callback, "on_train_begin", None))
                callback.on_train_begin = _nothing
            if directory is not None:
                changed += _redirect(callback, directory, restored=restored)
        yield
    finally:
        for obj, attribute, value in reversed(changed):
            if attribute.startswith("on_"):
                if attribute in vars(obj):
                    delattr(obj, attribute)  # the instance's own hook; the class' method shows again
            else:
                setattr(obj, attribute, value)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
