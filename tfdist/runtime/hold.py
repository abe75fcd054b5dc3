"""A benchmark's hold: after a chosen step a task waits until it has received SIGTERM or SIGUSR1.

A benchmark that preempts a run must signal it mid-run, and a fast run would
finish first. ``tfdist.bench.preemption`` sets ``TFDIST_HOLD_AT_STEP`` for the
``tfdist.train`` it preempts, whose main installs ``from_environment``'s hook.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tfdist.cluster.task import slug_of
from tfdist.engine.task import Hook
from tfdist.errors import RunFailed

#: The step after which each task holds; unset or empty: no hold.
STEP_VARIABLE = "TFDIST_HOLD_AT_STEP"
#: The directory that gets one marker file per holding task.
DIRECTORY_VARIABLE = "TFDIST_HOLD_DIR"
#: The bound of the wait, in seconds.
SECONDS_VARIABLE = "TFDIST_HOLD_SECONDS"
#: How often a holding task looks whether its signal arrived.
POLL_SECONDS = 0.005


def marker_name(task: str) -> str:
    """The marker file of ``task`` (``"worker:1"`` -> ``"worker-1.held"``)."""
    return slug_of(task) + ".held"


def hold_for_signal(begin: int, end: int, preemption, first_step_at: float | None) -> None:
    """If ``TFDIST_HOLD_AT_STEP`` lies in ``(begin, end]``: mark this task as held, wait for its signal.

    The marker (JSON: task, step, when its first step ended) goes into
    ``TFDIST_HOLD_DIR``; the wait lasts at most ``TFDIST_HOLD_SECONDS``. The
    next chunk then carries the task's vote to stop.

    Args:
      begin, end: the chunk of steps just trained.
      preemption: this task's ``runtime.preemption.Preemption`` (None: it takes no signal; the hold fails).
      first_step_at: unix time this task's first chunk ended, written into the marker.

    Raises:
      RunFailed: no signal within ``TFDIST_HOLD_SECONDS``, or the run takes no preemption signal.
    """
    at = os.environ.get(STEP_VARIABLE, "")
    if not at or not begin < int(at) <= end:
        return
    seconds = float(os.environ.get(SECONDS_VARIABLE, "60"))
    if preemption is None:
        raise RunFailed(f"{STEP_VARIABLE}={at} asks this task to hold for a signal, but its run takes no "
                        "preemption signal. Expected a run of tfdist.train, which takes SIGTERM.")
    where = preemption.where
    marker = Path(os.environ[DIRECTORY_VARIABLE]) / marker_name(where)
    partial = marker.with_suffix(".partial")
    partial.write_text(json.dumps({"task": where, "step": end, "first_step_at": first_step_at}))
    partial.replace(marker)  # whole or absent for a reader
    deadline = time.monotonic() + seconds
    while not preemption.requested:
        if time.monotonic() > deadline:
            raise RunFailed(f"{where} held after step {end} ({STEP_VARIABLE}={at}) for {seconds:g} s and "
                            "received no SIGTERM or SIGUSR1. Expected the process that set the hold to signal it.")
        time.sleep(POLL_SECONDS)


class HoldForSignal(Hook):
    """The hold as an engine hook: after each chunk's log row and checkpoint, ``hold_for_signal``."""

    def chunk_done(self, step: int, end: int, controller) -> None:
        hold_for_signal(step, end, controller.preemption, controller.first_step_at)


def from_environment() -> tuple[Hook, ...]:
    """The hold's hook when ``TFDIST_HOLD_AT_STEP`` asks for one; else none."""
    return (HoldForSignal(),) if os.environ.get(STEP_VARIABLE, "") else ()
