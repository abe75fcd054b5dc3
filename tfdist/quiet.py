"""TensorFlow's start-up noise kept off stderr, for every tfdist CLI (``cli.run_main`` calls ``install``)."""

from __future__ import annotations

import os
import re
import signal
import sys

#: The start-up lines dropped, as regular expressions searched in each line (one pattern per known line).
STARTUP_NOISE = (
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine",
    r"cuda_platform\.cc:\d+\] failed call to cuInit:",
    r"cuda_executor\.cc:\d+\] .*(kernel driver does not appear to be running|CUDA_ERROR_NO_DEVICE)",
    r"cuda_diagnostics\.cc:\d+\] ",
    r"oneDNN custom operations are on\.",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.$",
    r"Unable to register (cuDNN|cuFFT|cuBLAS) factory",
    r"computation_placer\.cc:\d+\] computation placer already registered",
    r"TF-TRT Warning: Could not find TensorRT",
)

#: Set to 1 to see TensorFlow's start-up lines (the opt-out).
OPT_OUT_ENV = "TFDIST_TF_LOGS"

_NOISE = re.compile(b"|".join(p.encode() for p in STARTUP_NOISE))
_SIGNALS_FOR_THE_RUN = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP")
_installed: dict = {}


def opted_out(environ=None) -> bool:
    """True when the user asked to see everything: ``TFDIST_TF_LOGS=1`` or ``TF_CPP_MIN_LOG_LEVEL=0``."""
    env = os.environ if environ is None else environ
    return env.get(OPT_OUT_ENV, "").strip().lower() in ("1", "true", "yes") or env.get(
        "TF_CPP_MIN_LOG_LEVEL", "").strip() == "0"


def is_noise(line: bytes) -> bool:
    """Whether one line (without its newline) is a known TensorFlow start-up line."""
    return _NOISE.search(line.rstrip(b"\r")) is not None


def filter_lines(data: bytes) -> tuple[bytes, bytes]:
    """Split ``data`` into what to forward (complete lines, noise dropped) and the unfinished rest."""
    *lines, rest = data.split(b"\n")
    return b"".join(line + b"\n" for line in lines if not is_noise(line)), rest


def install() -> bool:
    """Filter descriptor 2 from here on; ``sys.stderr`` writes to the original stderr. Returns True if installed.

    Call it before TensorFlow is imported. Idempotent; a no-op under the
    opt-out, once TensorFlow is imported, where descriptor 2 is closed, or
    without ``os.fork`` (Windows).
    """
    if _installed or opted_out() or "tensorflow" in sys.modules or not hasattr(os, "fork"):
        return False
    try:
        original = os.dup(2)
    except OSError:
        return False
    read_end, write_end = os.pipe()
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
    pid = os.fork()
    if pid == 0:  # a short-lived middle process; its child, the forwarder, is then no descendant of this one
        try:
            if os.fork() == 0:
                try:
                    _forwarder(read_end, original, write_end)
                finally:
                    os._exit(0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    os.set_inheritable(2, True)
    _installed.update(original=original)
    _rebind_python_stderr(original)
    return True


def _rebind_python_stderr(original: int) -> None:
    """``sys.stderr`` (and logging handlers that held the old one) onto the original stderr."""
    import logging

    old = sys.stderr
    new = os.fdopen(original, "w", buffering=1, encoding=getattr(old, "encoding", None) or "utf-8",
                    errors="backslashreplace", closefd=False)
    sys.stderr = new
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is old:
                handler.stream = new


def drain(timeout: float = 1.0) -> None:
    """Wait (at most ``timeout`` s) until the forwarder has read what C++ wrote so far.

    ``cli.run_main`` calls it before its one error line, so that a line
    TensorFlow wrote earlier is not printed after it.
    """
    if not _installed:
        return
    import fcntl
    import struct
    import termios
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pending = struct.unpack("i", fcntl.ioctl(2, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return
        if not pending:
            break
        time.sleep(0.01)
    time.sleep(0.02)  # the forwarder writes what it just read


def _forwarder(read_end: int, original: int, write_end: int) -> None:
    """The forked process: copy the pipe to the original stderr without the noise, until every writer is gone."""
    for name in _SIGNALS_FOR_THE_RUN:
        try:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        except (AttributeError, OSError, ValueError):
            pass
    os.close(write_end)
    # Hold nothing else of the parent's open (a caller waiting for EOF on its stdout must not wait for us).
    keep = sorted((read_end, original))
    os.closerange(0, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 1 << 16)
    import select

    rest = b""
    while True:
        if rest:  # an unfinished line: forward it if nothing more comes soon
            ready, _, _ = select.select([read_end], [], [], 0.2)
            if not ready:
                _write(original, rest)
                rest = b""
                continue
        try:
            chunk = os.read(read_end, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        out, rest = filter_lines(rest + chunk)
        _write(original, out)
    if rest and not is_noise(rest):
        _write(original, rest)


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:
            return  # the original stderr is gone: nothing left to show it to
