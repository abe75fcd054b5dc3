"""The progress watchdog: a run that makes no step for ``--progress_timeout`` seconds ends, naming who is behind."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from tfdist.cluster.task import slug_of
from tfdist.errors import PEER_LOST_EXIT_CODE, end_process

#: Longest seconds between two heartbeats (shorter for a short ``--progress_timeout``).
MAX_INTERVAL = 2.0

#: The phase of a task inside its steps (after its first chunk; that one is "first_step").
TRAINING = "training"
#: Phases in which a task is inside a step (and may wait there for input or for a collective).
STEPPING = (TRAINING, "first_step")

#: The first chunk of a process traces and compiles its step: it gets this many times ``timeout``,
#: and at least ``FIRST_STEP_SECONDS``.
FIRST_STEP_FACTOR = 3
FIRST_STEP_SECONDS = 120.0


def stale_after(interval: float = MAX_INTERVAL) -> float:
    """Seconds after which a heartbeat written every ``interval`` s counts as stopped (three missed, and 2 s)."""
    return 3 * interval + 2


def stopped_tasks(directory: Path, tasks: list[str], *, now: float | None = None) -> list[str]:
    """Those of ``tasks`` whose heartbeat in ``directory`` stopped (``"worker:1 (no heartbeat for 12 s)"``).

    For a lost-peer line (``runtime.lifecycle.among_peers``): a peer that is up but
    stopped or frozen still accepts connections, so only its heartbeat tells.
    A task with no heartbeat file is not named (it may never have started one).
    Each heartbeat is judged by the interval its task writes at (its record's
    ``interval``; ``MAX_INTERVAL`` where it has none). Under a short
    ``--progress_timeout`` a task writes every 0.6 s, and TensorFlow's
    coordination service (a 10 s heartbeat timeout, heartbeats every 5 s) can
    end the run about 5 s after a task stopped, before ``MAX_INTERVAL``'s
    8 s, which would name no one.
    """
    now = time.time() if now is None else now
    found = []
    for task in tasks:
        try:
            record = json.loads((Path(directory) / heartbeat_name(task)).read_text())
            age, interval = now - record["time"], float(record.get("interval", MAX_INTERVAL))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if age > stale_after(interval):
            found.append(f"{task} (no heartbeat for {age:.0f} s: stopped or frozen)")
    return found


def heartbeat_name(task: str) -> str:
    """``worker:1`` -> ``worker-1.json``."""
    return f"{slug_of(task)}.json"


class BatchCounter:
    """Counts the training batches an input pipeline hands to the steps of this process.

    The count is a variable on this host's CPU that the pipeline's last map adds to, inside TensorFlow's
    input threads: no Python runs per batch, so no input thread ever waits for the interpreter's lock (one that
    did would hang the process when its iterator is deleted, the main thread holding that lock as it waits for
    the input thread). Create it outside any strategy's scope.

    Args:
      start_step: the step the run starts (or resumes) at.
    """

    def __init__(self, start_step: int = 0):
        import tensorflow as tf

        self.start_step = start_step
        self.batches_per_step = 1
        with tf.init_scope(), tf.device("/cpu:0"):
            self._count = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_batches_fed")

    @property
    def fed(self) -> int:
        """The last step that has its batches: ``start_step`` + steps' worth of batches handed out."""
        return self.start_step + int(self._count.numpy()) // self.batches_per_step

    def wrap(self, dataset_fn: Callable) -> Callable:
        """``dataset_fn`` whose batches add to this counter as a step takes them (the last map of the pipeline).

        Only for pipelines that this process iterates (not a coordinator's
        per-worker datasets, which run on remote workers).
        """
        import tensorflow as tf

        count = self._count

        def tick(*batch):
            with tf.control_dependencies([count.assign_add(1)]):
                return tf.nest.map_structure(tf.identity, batch)

        def fn(context):
            from tfdist.engine.inputs import batches_per_step

            self.batches_per_step = batches_per_step(context)  # one per replica of this worker
            dataset = dataset_fn(context)
            if isinstance(dataset.element_spec, tuple):  # map passes a tuple's parts as arguments
                return dataset.map(tick)
            return dataset.map(lambda batch: tick(batch)[0])

        return fn


class Watchdog:
    """This task's heartbeat and, for a training task, its progress deadline.

    Args:
      task: this task's name (``"worker:1"``, ``"local"`` outside a cluster).
      tasks: every task of the cluster to read heartbeats of (``[task]`` outside a cluster).
      directory: where the heartbeat files are (the run directory's ``heartbeats/``).
      timeout: seconds without progress that end the run; 0: heartbeat only, never end it.
      step, total_steps: the step the run starts at and its last step, for the message.
      batches: this process's ``BatchCounter``, or None (a coordinator's workers read their own input).
      before_exit: called (bounded by the caller) right before the process ends, e.g. to tell serving tasks.
    """

    def __init__(self, *, task: str, tasks: list[str], directory: Path, timeout: float, step: int = 0,
                 total_steps: int = 0, batches: BatchCounter | None = None,
                 before_exit: Callable[[], None] | None = None):
        self.task = task
        self.tasks = tasks
        self.directory = Path(directory)
        self.timeout = timeout
        self.total_steps = total_steps
        self.batches = batches
        self.before_exit = before_exit
        self.interval = min(MAX_INTERVAL, max(0.5, timeout / 10)) if timeout else MAX_INTERVAL
        self.phase = "starting"
        self.until: int | None = None  # the end of the chunk of steps that runs (None: not training)
        self.step = step
        self.start_step = step
        self.progress_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # The main thread tells what it does -------------------------------------------------------------

    def progress(self, step: int | None = None, phase: str | None = None) -> None:
        """Something finished (a chunk, an eval, a save): the deadline starts again; optionally a new phase."""
        if step is not None:
            self.step = step
        if phase is not None:
            self.phase = phase
        self.progress_at = time.monotonic()

    def doing(self, phase: str, until: int | None = None) -> None:
        """The main thread starts ``phase`` (training, evaluating, checkpointing); training: steps up to
        ``until``."""
        self.phase, self.until = phase, until

    # The thread ---------------------------------------------------------------------------------

    def start(self, phase: str = "starting") -> None:
        """Write the first heartbeat and start the thread."""
        self.progress(phase=phase)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._watch, name="tfdist-watchdog", daemon=True)
        self._thread.start()

    def stop(self, *, ended_well: bool) -> None:
        """Stop the thread; a task that ended well removes its heartbeat, one that did not keeps it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval)
        if ended_well:
            self._path(self.task).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # the last task to end well leaves no empty directory

    def __enter__(self) -> Watchdog:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop(ended_well=exc[0] is None)

    def _path(self, task: str) -> Path:
        return self.directory / heartbeat_name(task)

    def _record(self) -> dict:
        return {"task": self.task, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(),
                "interval": self.interval, "phase": self.phase, "step": self.step, "until": self.until,
                "fed": self.batches.fed if self.batches is not None else None}

    def _write(self) -> None:
        path = self._path(self.task)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            partial.write_text(json.dumps(self._record()))
            os.replace(partial, path)
        except OSError:
            pass  # a full or read-only disk must not end training; the others will see a stale heartbeat

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._write()
            idle = time.monotonic() - self.progress_at
            limit = self.timeout if self.step > self.start_step else max(FIRST_STEP_FACTOR * self.timeout,
                                                                         FIRST_STEP_SECONDS)
            if self.timeout and idle > limit:
                self._fire(idle)

    def read(self) -> dict[str, dict | None]:
        """Every task's last heartbeat (None where there is none or it cannot be read)."""
        found: dict[str, dict | None] = {}
        for task in self.tasks:
            try:
                found[task] = json.loads(self._path(task).read_text())
            except (OSError, ValueError):
                found[task] = None
        return found

    def _fire(self, idle: float) -> None:
        """Stacks into the log, one line naming who is behind, status 4 (from this thread: the main one is stuck)."""
        sys.stderr.write(f"tfdist: {self.task} made no progress for {idle:.0f} s (--progress_timeout "
                         f"{self.timeout:g}); the Python stacks of its threads:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        line = describe(self.read(), me=self.task, now=time.time(), stale_after=stale_after(self.interval),
                        idle=idle, step=self.step, total_steps=self.total_steps)
        if self.before_exit is not None:
            try:
                self.before_exit()
            except Exception:  # noqa: BLE001 - ending with the line below matters more
                pass
        from tfdist import quiet

        quiet.drain()
        sys.stderr.write(f"error: {line}\n")
        end_process(PEER_LOST_EXIT_CODE)


def _doing(record: dict, most_fed: int | None, least_fed: int | None = None) -> str:
    """What a task with a fresh heartbeat is doing, in words.

    A training task whose input has fed fewer steps than another task's
    input has waits for its input pipeline; so does one whose input has not
    fed its chunk of steps (the steps up to ``until``; a record without it ran
    one step) while no training task's input fed more (``most_fed`` and
    ``least_fed`` equal, or None: one task). One that has its batch waits
    inside the step (for the collective that needs every task).
    """
    phase, step, fed = record["phase"], record["step"], record.get("fed")
    until = record.get("until") or step + 1
    if phase in STEPPING and fed is not None and ((phase == TRAINING and fed < until and most_fed == least_fed)
                                                  or (most_fed is not None and fed < most_fed)):
        return f"reading input (its batch for step {fed + 1} has not come from its input pipeline)"
    if phase == TRAINING:
        return f"waiting for a collective (in a step after step {step})"
    if phase == "first_step":
        return (f"in its first step after step {step} (tracing and compiling it, waiting for its first batch, "
                "or for a collective)")
    return {"evaluating": f"evaluating (after step {step})", "checkpointing": f"checkpointing (step {step})",
            "starting": "starting (building, restoring or compiling)",
            "serving": "serving the chief"}.get(phase, phase)


def describe(heartbeats: dict[str, dict | None], *, me: str, now: float, stale_after: float, idle: float,
             step: int, total_steps: int) -> str:
    """The line a watchdog ends with: how long, at which step, which tasks are behind and what they do.

    Args:
      heartbeats: every task's last heartbeat record (None: never written or unreadable).
      me: the task that writes the line.
      now: the current unix time (heartbeats are stamped with ``time.time()``).
      stale_after: seconds after which a heartbeat counts as stopped.
      idle, step, total_steps: this task's time without progress and last finished step.
    """
    stopped, fresh = {}, {}
    for task, record in heartbeats.items():
        if record is None:
            stopped[task] = "has written no heartbeat (not started, or --model_dir is not storage all tasks share)"
        elif now - record["time"] > stale_after:
            stopped[task] = (f"has not written its heartbeat for {now - record['time']:.0f} s "
                             "(the process is stopped or frozen, or its host is down)")
        else:
            fresh[task] = record
    feds = [r["fed"] for r in fresh.values() if r["phase"] in STEPPING and r.get("fed") is not None]
    most_fed, least_fed = max(feds, default=None), min(feds, default=None)
    training_somewhere = any(r["phase"] in STEPPING for r in fresh.values())
    behind = dict(stopped)
    waiting = {}
    for task, record in fresh.items():
        doing = _doing(record, most_fed, least_fed)
        if doing.startswith("reading input") or (training_somewhere and record["phase"] in
                                                  ("evaluating", "checkpointing", "starting")):
            behind[task] = doing
        elif record["phase"] != "serving":
            waiting[task] = doing
    head = f"No progress for {idle:.0f} s (--progress_timeout) at step {step} of {total_steps} (this is {me}): "
    if list(heartbeats) == [me] and me in fresh:  # one process: nobody to be behind of
        return head + f"it is {_doing(fresh[me], None)}. Its Python stacks are in its log."
    if not behind:
        everyone = "; ".join(f"{t} is {d}" for t, d in waiting.items()) or "no task trains"
        return head + f"no task is behind the others: {everyone}. The Python stacks of each task are in its log."
    named = "; ".join(f"{t} is behind: it {d}" if d.startswith("has ") else f"{t} is behind, {d}"
                      for t, d in behind.items())
    others = f"; {', '.join(waiting)} wait{'s' if len(waiting) == 1 else ''} for it in a collective" if waiting else ""
    return head + named + others + ". The Python stacks of each task that runs are in its log."
