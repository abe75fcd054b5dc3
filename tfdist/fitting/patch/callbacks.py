"""Keras' file-writing callbacks across workers: the chief writes the real files, the others a private copy."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from tfdist import _compat
from tfdist.runtime.placement import Placement


def _inside(directory: str, path: str) -> str:
    """``path``'s last component (a file or a directory) placed inside ``directory``."""
    return os.path.join(directory, os.path.basename(os.path.normpath(str(path))) or "files")


def _redirect(callback, directory: str) -> list[tuple[object, str, object]]:
    """Point ``callback``'s outputs into ``directory``; returns ``(object, attribute, old value)`` to restore."""
    import keras

    changed = []

    def move(obj, attribute, value):
        changed.append((obj, attribute, getattr(obj, attribute)))
        setattr(obj, attribute, value)

    if isinstance(callback, keras.callbacks.ModelCheckpoint):
        move(callback, "filepath", _inside(directory, callback.filepath))
    elif isinstance(callback, keras.callbacks.TensorBoard):
        move(callback, "log_dir", _inside(directory, callback.log_dir))
    elif isinstance(callback, keras.callbacks.CSVLogger):
        move(callback, "filename", _inside(directory, callback.filename))
    elif isinstance(callback, keras.callbacks.BackupAndRestore):
        # Restore from the real backup (every worker resumes from the same state), then write a private one.
        restore = callback.on_train_begin
        private = _inside(directory, callback.backup_dir)

        def on_train_begin(logs=None):
            restore(logs)
            move(callback, "backup_dir", private)
            for attribute in _compat.BACKUP_PATHS:
                move(callback, attribute, _inside(private, getattr(callback, attribute)))

        move(callback, "on_train_begin", on_train_begin)
    return changed


@contextlib.contextmanager
def chief_only_files(callbacks, placement: Placement):
    """While ``fit`` runs: on a worker that is not the chief, the callbacks write into a temporary directory."""
    if placement.is_chief:
        yield
        return
    directory = tempfile.mkdtemp(prefix=f"tfdist-{placement.task.slug}-")
    changed = []
    try:
        for callback in callbacks:
            changed += _redirect(callback, directory)
        yield
    finally:
        for obj, attribute, value in reversed(changed):
            if attribute == "on_train_begin":
                delattr(obj, attribute)  # the instance's own wrapper; the class' method shows again
            else:
                setattr(obj, attribute, value)
        shutil.rmtree(directory, ignore_errors=True)
