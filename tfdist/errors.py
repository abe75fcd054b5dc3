"""Every error that has an exit status and the one table of those statuses (the CLIs report them: ``cli``)."""

from __future__ import annotations

import atexit
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

#: A run that finished.
DONE_EXIT_CODE = 0
#: A user error: a bad flag, config, cluster file, dataset or task. Retrying cannot help.
USAGE_EXIT_CODE = 2
#: The loss became NaN or Inf; the last good checkpoint is kept. Retrying ends the same way.
DIVERGED_EXIT_CODE = 3
#: A peer of the cluster was lost or made no progress; relaunching resumes from the last checkpoint.
PEER_LOST_EXIT_CODE = 4
#: Preempted: a checkpoint of the step reached was written; run the same command again.
#: TensorFlow's own ``PreemptionCheckpointHandler`` restart code, so schedulers set up for it work unchanged.
PREEMPTED_EXIT_CODE = 42

#: Every exit status tfdist ends with, and what it means.
EXIT_CODES = {
    DONE_EXIT_CODE: "done",
    USAGE_EXIT_CODE: "a user error",
    DIVERGED_EXIT_CODE: "a diverged loss",
    PEER_LOST_EXIT_CODE: "a lost peer or no progress",
    PREEMPTED_EXIT_CODE: "preempted (restart to resume)",
}

#: Statuses after which a restart would end the same way (the launcher and Kubernetes do not retry them).
PERMANENT_EXIT_CODES = (USAGE_EXIT_CODE, DIVERGED_EXIT_CODE)


class UserError(ValueError):
    """An error caused by the user's input, reported as one line with exit status 2."""

    def __init__(self, message: str):
        # One line, always: collapse anything multi-line a caller passed in.
        super().__init__(" ".join(str(message).split()))


class DevicesFixed(UserError):
    """TensorFlow has started, so this process's logical devices can no longer be split as asked."""


class RunFailed(RuntimeError):
    """A run that started well but cannot go on (e.g. a diverged loss); one line, ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class TrainingDiverged(RunFailed):
    """The loss became NaN or Inf; the last good checkpoint is kept (exit status 3)."""

    exit_code = DIVERGED_EXIT_CODE


class PeerLost(RunFailed):
    """A task of the cluster was lost mid-run; relaunching the cluster resumes from the last checkpoint (exit 4)."""

    exit_code = PEER_LOST_EXIT_CODE


class CollectiveFailed(RunFailed):
    """A collective across workers failed (``collective_failure``): which one and on which worker, in one line."""


#: What a collective's op type does, for its line.
COLLECTIVE_KINDS = {"CollectiveReduce": "all-reduce", "CollectiveGather": "all-gather", "CollectiveBcast": "broadcast",
                    "CollectiveAllToAll": "all-to-all", "CollectiveAssignGroup": "group assignment",
                    "CollectiveInitializeCommunicator": "communicator set-up"}


def collective_failure(error: BaseException, task: str, workers: int, what: str) -> CollectiveFailed | None:
    """The line of a TensorFlow error raised by a collective across workers, or None for another error.

    TensorFlow's own text ends with "Restart your program to reset" and names neither the collective nor
    the worker in words; the line names the collective (its kind, op and function), the worker whose op
    failed (this ``task`` where the text does not say), the cause, and what to do.

    Args:
        error: the exception ``what`` raised.
        task: this process's task (``worker:1``).
        workers: the workers of the cluster.
        what: what ran the collective ("Keras' fit", "training").
    """
    import re

    text = str(getattr(error, "message", None) or error)
    if not type(error).__module__.startswith("tensorflow") or "ollective" not in text:
        return None
    nodes = re.findall(r"\{\{node ([^}]+)\}\}", text) + re.findall(r"Detected at node (\S+)", text)
    node = next((n for n in nodes if "Collective" in n), nodes[0] if nodes else "")
    op = re.sub(r"_\d+$", "", node.rsplit("/", 1)[-1])
    kind = next((k for prefix, k in COLLECTIVE_KINDS.items() if op.startswith(prefix)), "collective")
    function = re.search(r"__inference_(\w+?)_\d+", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = next((line.split("aborted by:", 1)[1].strip() for line in lines if "aborted by:" in line), None) or \
        next((line for line in lines if "ollective" in line and not line.startswith(("[[", "Detected at"))), "")
    cause = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", cause)
    cause = re.sub(r"\s*This is likely due to .*$", "", cause)
    device = re.search(r"/job:(\w+)/replica:\d+/task:(\d+)", cause)
    failed_on = f"{device.group(1)}:{device.group(2)}" if device else task
    cause = re.sub(r"\.? Op at device /job:(\w+)/replica:\d+/task:(\d+)/device:\S+", r": the op on \1:\2", cause)
    named = f"the {kind} {node}" + (f" in {function.group(1)}" if function else "") if node else f"a {kind}"
    return CollectiveFailed(
        f"A collective failed in {what} across {workers} workers, on {failed_on} (this is {task}): {named}: "
        f"{cause.rstrip('.')[:400] or type(error).__name__}. Received: {type(error).__name__} from TensorFlow. "
        "Expected every worker to run the same collectives on tensors of the same shapes; TensorFlow aborts "
        "every later collective of these processes: start every worker again.")


class Preempted(RunFailed):
    """The run was asked to stop (SIGTERM) and saved the step it reached; run it again to resume (exit 42)."""

    exit_code = PREEMPTED_EXIT_CODE


class PreemptedExit(SystemExit):
    """The end of a preempted ``tfdist.fit`` or Keras ``fit`` across workers: the step reached is saved.

    A ``SystemExit`` with status 42: uncaught in a script, the process ends with that status and a scheduler
    (or ``tfdist.launch``) runs the same command again, which resumes; in a notebook the kernel lives on.
    Raise it with ``preempted_exit``.
    """

    def __init__(self, message: str):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.message = " ".join(str(message).split())

    def __str__(self) -> str:
        return self.message


def preempted_exit(message: str) -> PreemptedExit:
    """The ``PreemptedExit`` to raise; when the interpreter then exits, it ends with 42 before its teardown.

    Once Python finalizes, its signal handlers are back to the default: a launcher stopping the other tasks
    would turn the 42 of a task that saved its step into a death by signal (143), and TensorFlow's teardown
    can wait on peers. An ``atexit`` hook, the first to run, ends the process there; a notebook's kernel,
    which does not exit, is left running.
    """
    atexit.register(end_process, PREEMPTED_EXIT_CODE)
    return PreemptedExit(message)


def end_process(status: int) -> NoReturn:
    """End this process at once with ``status``, after flushing stdio: the one hard exit of tfdist.

    For a process that must not run Python's teardown: a CLI whose run failed, a task stuck in a collective
    whose peer is gone (the watchdog), a serving task whose gRPC server cannot be stopped, a script's
    uncaught ``UserError``. TensorFlow's teardown would wait on, or abort with, the collectives of peers.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def short(value: Any, limit: int = 80) -> str:
    """``repr`` of a received value, cut so that an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def article(noun: str) -> str:
    """``noun`` with its indefinite article, for messages: "an int", "a list"."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def resolve_dots(path) -> Path:
    """``path`` with its ``..`` segments resolved as the kernel resolves them (through symbolic links), so that a
    directory a ``..`` steps out of is never made; a path without ``..`` as it is.

    Every directory argument that tfdist makes (``--model_dir``, ``model_dir``, ``--dump_weights``) is taken so.
    """
    path = Path(path)
    return Path(os.path.realpath(path)) if ".." in path.parts else path


def file_in_the_way(path) -> Path | None:
    """The file at ``path`` or at its nearest existing parent: what stops a directory being made at ``path``.

    None when ``path`` is a directory, or nothing stops one being made there. A directory argument is checked
    with it before anything is written, so that the mistake is one line, not a traceback after the run.
    """
    found = _nearest_existing(path)
    return found if found is not None and not found.is_dir() else None


def _nearest_existing(path) -> Path | None:
    """``path`` or its nearest parent that exists, or None."""
    path = Path(path)
    return next((p for p in (path, *path.parents) if p.exists()), None)


def check_directory(path, name: str, expected: str, *, writable: bool = True) -> None:
    """Refuse a directory argument that cannot be one, before anything is written: the one check and wording of
    every directory that tfdist makes (``--model_dir``, ``model_dir``, ``--dump_weights``, ``--data_dir``).

    Args:
        path: the directory as the user gave it (it may not exist yet).
        name: the argument as the user wrote it (``--model_dir``, or ``model_dir`` of ``tfdist.fit``).
        expected: the sentence that says what is expected (``"Expected a directory ..."``).
        writable: also refuse a place this process cannot create files in (``unwritable_directory``).

    Raises:
        UserError: ``path`` is a file, lies under a file, or (``writable``) where nothing can be written.
    """
    received = str(path)
    unreachable = _unreachable(path)
    if unreachable:
        raise UserError(f"Invalid value for `{name}`: {unreachable}. Received: {short(received, 120)}. {expected}")
    blocking = file_in_the_way(path)
    if blocking == Path(path):
        raise UserError(f"Invalid value for `{name}`: not a directory. Received: {received!r}, an existing file. "
                        f"{expected}")
    if blocking is not None:
        raise UserError(f"Invalid value for `{name}`: {blocking} is a file. Received: {received!r}. {expected}")
    locked = unwritable_directory(path) if writable else None
    if locked is not None:
        raise UserError(f"Invalid value for `{name}`: {locked} is not writable. Received: {received!r}. {expected}")


def _unreachable(path) -> str | None:
    """Why no directory can be at ``path`` whatever is made on the way (a symbolic link loop, a name too long, a NUL
    character, a parent this process may not search), or None: nothing is there, or something that
    ``file_in_the_way`` names."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError as e:  # a NUL character
        return f"not a path ({e})"
    except OSError as e:
        return f"{e.strerror or type(e).__name__}"
    return None


def special_file(path) -> str | None:
    """What ``path`` is when it is neither a regular file nor a directory (a FIFO, a socket, a device), or None.

    Reading one can block for ever (a FIFO nobody writes) or never end (a device), so a file argument is checked
    with it before it is opened. None too where nothing is at ``path``: opening it then says what is wrong.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def unwritable_file(path) -> str | None:
    """Why no file can be written at ``path`` (the system's reason, e.g. "No such file or directory"), or None.

    The write is tried (the file opened to append, so an existing one keeps its bytes, and removed again if it was
    not there): ``os.access`` calls ``/proc`` and ``/sys`` writable for root. Checked with ``special_file`` first,
    since opening a FIFO waits for a reader.
    """
    existed = os.path.lexists(path)
    try:
        with open(path, "ab"):
            pass
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e) or type(e).__name__
    if not existed:
        os.remove(path)
    return None


def unwritable_directory(path) -> Path | None:
    """The nearest existing directory at or above ``path`` in which this process cannot create files, or None.

    Checked with ``file_in_the_way`` before anything is written or trained, so that a directory the user cannot
    write is one line at the start, not a ``PermissionError`` traceback after the run.
    The write is tried (a directory made and removed there): ``os.access`` calls every directory writable for
    root, ``/proc`` and ``/sys`` included, where making one fails.
    """
    found = _nearest_existing(path)
    if found is None or not found.is_dir():
        return None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tfdist-write-check-", dir=found))
    except OSError:
        return found
    return None


def check_keras_backend(environ=None) -> None:
    """Refuse a Keras backend other than TensorFlow's, before Keras is imported (every CLI, ``tfdist.setup``/``fit``).

    Keras reads ``KERAS_BACKEND`` once, when it is imported; under JAX or PyTorch it fails deep inside
    Keras (or trains something tfdist's strategies cannot distribute). A Keras already imported is asked itself.

    Raises:
        UserError: ``KERAS_BACKEND`` (or the imported Keras' backend) is not ``tensorflow``.
    """
    env = os.environ if environ is None else environ
    keras = sys.modules.get("keras")
    backend_module = getattr(keras, "backend", None)
    imported = backend_module.backend() if hasattr(backend_module, "backend") else None
    chosen = imported or env.get("KERAS_BACKEND", "").strip()
    if chosen and chosen != "tensorflow":
        source = "the imported Keras' backend" if imported else "KERAS_BACKEND"
        raise UserError(f"Unsupported Keras backend: tfdist trains with the TensorFlow backend. Received: {source}="
                        f"{chosen!r}. Expected KERAS_BACKEND=tensorflow (or unset), set before Keras is imported.")
