"""A script's saves land once across workers: the chief writes the path the script names, every other worker makes
the same save into a scratch directory of its own (removed after), or into the path it names where that is its own
(not the chief's), and the call returns on each worker only once the chief's file is whole, so that a load right
after it reads the chief's finished file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

from tfdist import _compat
from tfdist.errors import PeerLost, UserError
from tfdist.one_device.chief_files import inside

#: The longest wait ``get_config_key_value`` takes, in milliseconds: a wait without bound (a progress timeout of 0).
UNBOUNDED_MS = 2**31 - 1

#: The packages whose own saves are left as they are: Keras' callbacks (``ModelCheckpoint``, ``BackupAndRestore``)
#: already write the chief's files alone under Keras' own ``fit``, tfdist's loop writes its checkpoints so, and
#: Keras' and TensorFlow's saves call each other.
LIBRARIES = ("keras", "tensorflow", "tfdist", "tf_keras")

#: The prefix of the keys the chief sets in the coordination service when a save is done (``_key``).
KEY_PREFIX = "tfdist/saves/"

_local = threading.local()
_counts: dict[str, int] = {}


@contextlib.contextmanager
def saves_on_every_worker() -> Iterator[None]:
    """While it runs, this thread's saves write where the script says on every worker, each its own (as without
    tfdist): for paths that differ between workers, or a disk of each worker's own.

        with tfdist.saves_on_every_worker():
            model.save(f"/local/worker-{task_id}/model.keras")
    """
    with _flag("every_worker"):
        yield


def install() -> None:
    """Wrap the saves a script makes (Keras' ``Model.save``, ``save_weights``, ``export``, ``keras.saving.save_model``;
    TensorFlow's ``Checkpoint.save``/``write``, ``CheckpointManager.save``, ``tf.saved_model.save``); idempotent.
    Each stays as it was where no strategy across workers is in use."""
    import keras
    import tensorflow as tf

    for name in ("save", "save_weights", "export"):
        _wrap_attribute(keras.Model, name, _path_save(getattr(keras.Model, name), "filepath"))
    for name in ("save", "write"):
        _wrap_attribute(tf.train.Checkpoint, name, _path_save(getattr(tf.train.Checkpoint, name), "file_prefix"))
    _wrap_attribute(tf.train.CheckpointManager, "save", _manager_save(tf.train.CheckpointManager.save))
    save_model = _path_save(keras.saving.save_model, "filepath")
    for module in (keras.saving, keras.models):
        _wrap_attribute(module, "save_model", save_model)
    _wrap_attribute(tf.saved_model, "save", _path_save(tf.saved_model.save, "export_dir"))


def _wrap_attribute(owner, name: str, wrapper) -> None:
    if not getattr(getattr(owner, name), "tfdist_saves", False):
        setattr(owner, name, wrapper)


def _path_save(save: Callable, path_name: str) -> Callable:
    """``save(what, path, ...)`` (a method, or a function of what it saves) made once across workers, its path
    given second or as ``path_name``."""
    if getattr(save, "tfdist_saves", False):
        return save

    @functools.wraps(save)
    def wrapper(*args, **kwargs):
        caller = sys._getframe(1)
        if not args or len(args) < 2 and path_name not in kwargs or _left_alone(caller):
            return save(*args, **kwargs)
        what, path = args[0], args[1] if len(args) > 1 else kwargs[path_name]

        def call(target):
            if len(args) > 1:
                return save(what, target, *args[2:], **kwargs)
            return save(what, **{**kwargs, path_name: target})

        return _once(call, path, _saved_objects(what), caller)

    wrapper.tfdist_saves = True
    return wrapper


def _manager_save(save: Callable) -> Callable:
    """``tf.train.CheckpointManager.save`` made once across workers: the manager's directory is the path."""
    if getattr(save, "tfdist_saves", False):
        return save

    @functools.wraps(save)
    def wrapper(self, *args, **kwargs):
        caller = sys._getframe(1)
        if _left_alone(caller):
            return save(self, *args, **kwargs)

        def call(target):
            if target == self.directory:
                return save(self, *args, **kwargs)
            with _compat.checkpoint_manager_in(self, target):
                return save(self, *args, **kwargs)

        return _once(call, self.directory, _saved_objects(self.checkpoint), caller)

    wrapper.tfdist_saves = True
    return wrapper


def _left_alone(caller) -> bool:
    """Whether a save runs as it is: one made by Keras, TensorFlow or tfdist, inside another save, or under
    ``saves_on_every_worker``."""
    if getattr(_local, "every_worker", False) or getattr(_local, "saving", False):
        return True
    return str(caller.f_globals.get("__name__", "")).split(".")[0] in LIBRARIES


def _saved_objects(what) -> list:
    """What a save writes, to find its strategy: the object itself, and a checkpoint's own objects."""
    found = [what]
    try:
        found += list(vars(what).values())
    except TypeError:
        pass
    return found


def _strategy(objects) -> Any:
    """The strategy across workers a save runs under, or None: its objects' (a model's), the scope's, the process'."""
    import tensorflow as tf

    from tfdist.keras_fit import strategy_once

    candidates = [getattr(o, "distribute_strategy", None) for o in objects if _is_model(o)]
    candidates += [tf.distribute.get_strategy() if tf.distribute.has_strategy() else None, strategy_once.first()]
    for strategy in candidates:
        if strategy is not None and _compat.is_multi_worker(strategy):
            return strategy
    return None


def _is_model(value) -> bool:
    import keras

    return isinstance(value, keras.Model)


def _once(call: Callable[[str], Any], path, objects, caller) -> Any:
    """Run ``call`` (a save into the path it is given) once across workers: the chief into ``path``; any other
    worker, once the chief has reached the same place in the script (``caller``'s, ``_key``), into a scratch
    directory removed after, or into its own ``path`` where that is not the chief's (a path of the worker's own,
    written as the script says); then each returns once the chief's save is done. A path ``call`` returns that
    names the scratch copy names ``path``'s instead.

    Raises:
      RuntimeError: on a worker other than the chief, the chief's matching save failed (its error is said).
      UserError: on a worker other than the chief, a save the chief never makes (``_chiefs_path``).
    """
    strategy = _strategy(objects)
    if strategy is None or not isinstance(path, (str, bytes, os.PathLike)):
        return _saving(call, path)  # no strategy across workers, or no path to land once: as in one process
    path = os.fspath(path)
    key = _key(caller)
    if strategy.extended.should_checkpoint:
        _compat.set_cluster_value(f"{key}/path", _where(path))
        try:
            result = _saving(call, path)
        except BaseException as e:
            _compat.set_cluster_value(f"{key}/done", f"failed: {type(e).__name__}: {' '.join(str(e).split())}"[:2000])
            raise
        _compat.set_cluster_value(f"{key}/done", "done")
        return result
    if _chiefs_path(key, path, caller) != _where(path):
        result = _saving(call, path)  # the worker's own path: its own file, as the script says
    else:
        result = _scratch(call, path, strategy.cluster_resolver)
    told = _chiefs_value(f"{key}/done", path, caller, "began that save and has not finished it")
    if told != "done":
        raise RuntimeError(f"The chief's save of {path} failed, so this worker has no file to read there: {told}")
    return result


def _chiefs_path(key: str, path: str, caller) -> str:
    """The path the chief announced for its save ``key``, once it has reached it.

    Raises:
      UserError: the chief's process ended without that save: this worker makes a save from a place in the
        script that the chief never reaches, so no file of the chief's comes.
      PeerLost: the chief, alive, did not reach that save within the progress timeout (``_chiefs_value``).
    """
    import tensorflow as tf

    try:
        return _chiefs_value(f"{key}/path", path, caller, "has not reached that save")
    except tf.errors.OpError as e:
        told = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(
            f"Invalid save of {path} at {_place(caller)} on a worker that is not the chief: the chief made no save "
            f"from that place in the script, and no longer can ({told}). Received: a save that this worker makes "
            "and the chief does not. Expected every worker to make the same saves from the same places; a file of "
            "a worker's own is saved inside tfdist.saves_on_every_worker().") from e


def _chiefs_value(key: str, path: str, caller, waiting_for: str) -> str:
    """The value the chief sets at ``key`` for this worker's save of ``path``, waited for as long as the progress
    timeout (``progress_timeout`` of ``tfdist.setup``'s session, else its default; 0: no bound) allows.

    Raises:
      PeerLost: the timeout passed: the chief is alive but stuck (``waiting_for`` says where), as the watchdog
        ends a run that makes no step.
      tf.errors.OpError: the chief's process ended before it set ``key``.
    """
    import tensorflow as tf

    seconds = _progress_timeout()
    started = time.monotonic()
    try:
        return _compat.cluster_value(key, int(seconds * 1000) if seconds else UNBOUNDED_MS)
    except tf.errors.DeadlineExceededError:
        waited = time.monotonic() - started
        if not seconds or waited < seconds:
            raise
        raise PeerLost(
            f"No progress for {waited:.0f} s (progress_timeout {seconds:g}) in the save of {path} at "
            f"{_place(caller)} on a worker that is not the chief: the chief is alive but {waiting_for}, and this "
            "worker returns only once the chief's file is whole. Look at what holds the chief there (its stacks: "
            "py-spy dump), or give tfdist.setup a longer progress_timeout for a save that takes that long.") from None


def _progress_timeout() -> float:
    """The progress timeout, in seconds, of this process' ``tfdist.setup`` session (the default without one)."""
    from tfdist.config import RuntimeConfig
    from tfdist.runtime import who

    session = who.current()
    return (session.runtime if session is not None else RuntimeConfig()).progress_timeout


def _place(caller) -> str:
    """``caller``'s place in the script (its file's name, a colon, its line), for a message."""
    return f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"


def _where(path: str) -> str:
    """``path`` as every worker names the same place: absolute (a URL as it is)."""
    return path if "://" in path else os.path.abspath(path)


def _scratch(call: Callable[[str], Any], path: str, resolver) -> Any:
    """``call`` into a scratch directory of this worker's own, removed after; a path it returns or an error it
    raises names ``path`` instead of the scratch copy."""
    scratch = tempfile.mkdtemp(prefix=f"tfdist-{resolver.task_type}-{resolver.task_id}-save-")
    target = inside(scratch, path)
    try:
        result = _saving(call, target)
    except Exception as e:
        e.args = tuple(a.replace(target, path) if isinstance(a, str) else a for a in e.args)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if isinstance(result, str) and result.startswith(target):
        return path + result[len(target):]
    return result


def _saving(call: Callable[[str], Any], path: str) -> Any:
    """``call(path)``, with the saves it makes itself left as they are."""
    with _flag("saving"):
        return call(path)


@contextlib.contextmanager
def _flag(name: str) -> Iterator[None]:
    """This thread's flag ``name`` set while the block runs, as it was after."""
    previous = getattr(_local, name, False)
    setattr(_local, name, True)
    try:
        yield
    finally:
        setattr(_local, name, previous)


def _key(caller) -> str:
    """The key of this process' next save made from ``caller``'s place in the script: its line, and the lines of
    the calls that led there.

    Every worker runs the same script, so its n-th save from one place is every other worker's n-th save from that
    place, whatever path each names there (the chief's own, a scratch path of a worker's own, as Keras 2's
    multi-worker guide wrote) and whatever saves the chief alone makes elsewhere (``if is_chief: ...``).
    """
    lines = []
    frame = caller
    while frame is not None:
        lines.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    site = hashlib.sha256("|".join(lines).encode()).hexdigest()[:24]
    _counts[site] = _counts.get(site, 0) + 1
    return f"{KEY_PREFIX}{site}/{_counts[site]}"
