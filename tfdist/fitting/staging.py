"""A coordinator's training input, staged on disk for its workers: bounded, with progress, and interruptible.

A dataset function sent to a remote worker cannot carry its data as constants (gRPC refuses messages over
4 MB), so the chief saves the input (``Dataset.save``) where every task reads it. The save runs on a thread
while the chief's main thread watches the bytes written: it prints a line every ``PROGRESS_BYTES``, stops at
the limit with one line naming the size, and a preemption signal, which Python handles on the main thread
only, stops it as it stops a run. A stage is written under a ``.partial`` name and renamed once complete, so
a stage that was cut short is never read as a whole one. The main thread waits on an event the save sets at
its end, never in ``Thread.join``: a signal handler raising there (Python 3.11) marks a running thread as
ended, and the files of a save still writing would be removed too early.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfdist.errors import UserError

#: Bytes a staged input may take on disk unless ``LIMIT_VARIABLE`` says otherwise.
LIMIT_BYTES = 2 << 30
#: The environment variable that sets another limit, in bytes.
LIMIT_VARIABLE = "TFDIST_STAGE_LIMIT"
#: A progress line each time this many more bytes are staged.
PROGRESS_BYTES = 128 << 20
#: Seconds between two looks at the bytes written (and at the signals Python handles meanwhile).
POLL_SECONDS = 0.1
#: Seconds a stopped save has to end before its files are removed anyway.
STOP_SECONDS = 10.0


def limit_bytes() -> int:
    """The staging limit: ``LIMIT_VARIABLE`` when set (a positive number of bytes), else ``LIMIT_BYTES``."""
    given = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not given:
        return LIMIT_BYTES
    try:
        limit = int(given)
    except ValueError:
        limit = 0
    if limit < 1:
        raise UserError(f"Invalid {LIMIT_VARIABLE}. Received: {LIMIT_VARIABLE}={given!r}. Expected a positive "
                        f"number of bytes (default {LIMIT_BYTES}).")
    return limit


def size_text(size: float) -> str:
    """``"1.5 GiB"`` for ``1.5 * 2**30``; whole bytes below 1 KiB."""
    units = ("bytes", "KiB", "MiB", "GiB")
    power = 0
    while size >= 1024 and power < len(units) - 1:
        size, power = size / 1024, power + 1
    return f"{size:.0f} bytes" if power == 0 else f"{size:.1f} {units[power]}"


def element_bytes(element) -> int:
    """The bytes of one dataset element's tensors (strings: their characters)."""
    total = 0
    for part in tf.nest.flatten(element, expand_composites=True):
        value = part.numpy() if hasattr(part, "numpy") else np.asarray(part)
        if value.dtype == object:
            total += sum(len(v) for v in np.ravel(value))
        else:
            total += value.nbytes
    return total


def refuse(what: str, size: str, limit: int, instead: str) -> UserError:
    """The one line for an input whose stage would exceed ``limit`` bytes."""
    return UserError(
        f"Invalid `x` under parameter_server: {what} must be staged on disk for the workers, and its stage "
        f"{size}, over the staging limit of {size_text(limit)} ({LIMIT_VARIABLE}={limit}). Expected {instead}, "
        f"or a larger {LIMIT_VARIABLE} (in bytes)."
    )


def disk_bytes(directory: Path) -> int:
    """The bytes of every file under ``directory`` (0 when there is none)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # a file the save just renamed or removed
                pass
    return total


def _ending_when(dataset, stopped: threading.Event):
    """``dataset``, ending once ``stopped`` is set: a save cannot be cancelled otherwise (its op ignores
    TensorFlow's cancellation), and ending its stream ends it. Each element asks (about 0.2 ms): stage
    elements of some size, not single rows."""
    return dataset.take_while(lambda *_: tf.ensure_shape(tf.py_function(lambda: not stopped.is_set(), [], tf.bool), []))


def stage(dataset, directory: Path, *, what: str, instead: str, limit: int) -> None:
    """``dataset.save`` into ``directory``, watched from this thread (see the module's docstring).

    Args:
      dataset: a finite ``tf.data.Dataset``.
      directory: where the stage goes; what was there is removed first.
      what, instead: for the lines: what is staged, and what to pass instead when it is too large.
      limit: the bytes the stage may take.

    Raises:
      UserError: the stage would exceed ``limit`` (its files are removed).
      Preempted: a preemption signal arrived while staging (its files are removed).
    """
    directory = Path(directory)
    partial = directory.with_name(directory.name + ".partial")
    for old in (directory, partial):
        shutil.rmtree(old, ignore_errors=True)
    stopped, ended = threading.Event(), threading.Event()
    failed: list[BaseException] = []
    guarded = _ending_when(dataset, stopped)

    def save() -> None:
        try:
            guarded.save(str(partial))
        except BaseException as e:  # noqa: BLE001 (raised again on the main thread)
            failed.append(e)
        finally:
            ended.set()

    threading.Thread(target=save, name="tfdist-stage", daemon=True).start()
    try:
        shown, last = 0, False
        while not last:  # a last look once the save has ended: its last bytes count too
            last = ended.wait(POLL_SECONDS)
            written = disk_bytes(partial)
            if written > limit:
                raise refuse(what, f"reached {size_text(written)} before its end", limit, instead)
            if written >= shown + PROGRESS_BYTES:
                shown = written - written % PROGRESS_BYTES
                sys.stderr.write(f"tfdist: staged {size_text(written)} of {what} for the workers in {partial} "
                                 f"(limit {size_text(limit)}, {LIMIT_VARIABLE})\n")
                sys.stderr.flush()
        if failed:
            raise failed[0]
    except BaseException:
        stopped.set()
        ended.wait(STOP_SECONDS)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(directory)
