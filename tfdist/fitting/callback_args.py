"""``tfdist.fit``'s ``callbacks``, checked before anything trains: Keras callbacks, and the directories the
file-writing ones save in."""

from __future__ import annotations

from tfdist.errors import UserError, short


def check_callbacks(callbacks) -> None:
    """``callbacks``: None, or a list of ``keras.callbacks.Callback`` (as Keras' ``fit`` takes them)."""
    if callbacks is None:
        return
    import keras

    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else None
    wrong = [c for c in items if not isinstance(c, keras.callbacks.Callback)] if items is not None else [callbacks]
    if wrong:
        raise UserError(f"Invalid `callbacks`. Received: {short(wrong[0])} ({type(wrong[0]).__name__}). Expected a "
                        "list of keras.callbacks.Callback.")
    for callback in items:
        _check_callback_paths(callback)


def _check_callback_paths(callback) -> None:
    """Refuse, before anything trains, a directory of a Keras callback that cannot be one (a file, under a file, a
    FIFO, a symbolic link loop, where nothing can be written): Keras' ``fit`` would fail at the callback's first
    save, after an epoch. ``BackupAndRestore``'s ``backup_dir``, ``TensorBoard``'s ``log_dir`` and the folder of a
    ``ModelCheckpoint``'s or ``CSVLogger``'s file."""
    import os

    import keras

    from tfdist.errors import check_directory

    name = type(callback).__name__
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        paths = [("backup_dir", callback.backup_dir, False)]
    elif isinstance(callback, keras.callbacks.TensorBoard):
        paths = [("log_dir", callback.log_dir, False)]
    elif isinstance(callback, keras.callbacks.ModelCheckpoint):
        paths = [("filepath", callback.filepath, True)]
    elif isinstance(callback, keras.callbacks.CSVLogger):
        paths = [("filename", callback.filename, True)]
    else:
        return
    for attribute, path, of_file in paths:
        argument = f"{attribute}` of the {name} in `callbacks"
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).strip():
            raise UserError(f"Invalid `{argument}`. Received: {attribute}={short(path, 60)}. Expected a path.")
        path = os.fspath(path)
        if of_file and os.path.isdir(path):
            raise UserError(f"Invalid `{argument}`: a directory. Received: {path!r}. Expected the path of a file.")
        folder = os.path.dirname(os.path.abspath(path)) if of_file else path
        check_directory(folder, argument, f"Expected a {'folder for the file' if of_file else 'directory'} that "
                        "can be made and written, as Keras' callback saves there.")
