"""Callbacks' files written by the chief alone: on every other worker a file-writing callback writes into a
temporary directory of its own, removed after, so that every worker runs the same callbacks (what they change
changes alike) and the files are written once. Both fits run the user's callbacks so across workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from tfdist import _compat
from tfdist.runtime.placement import Placement


def inside(directory: str, path: str) -> str:
    """``path``'s last component (a file or a directory) placed inside ``directory``."""
    return os.path.join(directory, os.path.basename(os.path.normpath(str(path))) or "files")


def _redirect(callback, directory: str, *, restored: bool) -> list[tuple[object, str, object]]:
    """Point ``callback``'s outputs into ``directory`` (a ``RemoteMonitor`` posts nothing); returns ``(object,
    attribute, old value)`` to restore.

    ``restored``: a ``BackupAndRestore`` restored its backup already (``fitting.callbacks.restore_backups``), so
    its paths move now; else it restores from the real backup in its ``on_train_begin`` (every worker resumes from
    the same state), and they move after."""
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


def _nothing(*args, **kwargs) -> None:
    """A callback's hook that does nothing here: a ``BackupAndRestore``'s ``on_train_begin`` once
    ``tfdist.fit`` has restored it, a ``RemoteMonitor``'s post on a worker that is not the chief."""


@contextlib.contextmanager
def chief_only_files(callbacks, placement: Placement, *, restored: bool = False):
    """While ``fit`` runs: on a worker that is not the chief, the callbacks write into a temporary directory
    (removed after). Enter it before the callbacks get their model: ``TensorBoard`` fixes its writers' paths (and
    writes the model's graph) in ``set_model``.

    ``restored``: ``tfdist.fit`` restored the ``BackupAndRestore`` callbacks' backups
    (``fitting.callbacks.restore_backups``), so their ``on_train_begin`` restores nothing again, on every worker;
    else it restores from the chief's backup, as Keras' ``fit`` calls it.
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
