"""The outer loop every strategy shares, as Orbit's ``Controller``: train a chunk, log, checkpoint, evaluate."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from typing import Callable, NoReturn

import numpy as np

from tfdist.errors import Preempted, TrainingDiverged
from tfdist.engine.hold import hold_for_signal
from tfdist.engine.steps import StatsAccumulator


def next_boundary(step: int, every: int) -> int:
    """The first multiple of ``every`` after ``step``."""
    return (step // every + 1) * every


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the controller stops between steps: every chunk ends on a loop, log, checkpoint and epoch boundary."""

    total_steps: int
    steps_per_epoch: int
    steps_per_loop: int = 1
    log_every: int = 1
    checkpoint_every: int = 1


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What a client runs between chunks (all optional).

    Attributes:
      epoch_end: ``(step, train metrics of the epoch's last log window, eval metrics or None) -> stop?``, on
        every task at each epoch's end (``tfdist.fit``'s callbacks); the run stops when any task says so.
      chunk_begin: ``(step, end) -> None`` before each chunk of steps ``[step, end)``.
      chunk_end: ``(step, end, metrics of the log window so far) -> None`` after each chunk.
      eval_begin: ``() -> None`` before each eval pass (a model's own metrics are reset there).
      clock: a list that gets ``(step, time.perf_counter())`` at the end of every chunk: a benchmark's window.
    """

    epoch_end: Callable | None = None
    chunk_begin: Callable | None = None
    chunk_end: Callable | None = None
    eval_begin: Callable | None = None
    clock: list | None = None


class Controller:
    """Drives ``loop`` from ``start_step`` to the schedule's ``total_steps``.

    Args:
      loop: a ``Loop`` (``engine.loop``); its ``steps`` read the stats vectors (``engine.steps.Steps``).
      schedule: a ``Schedule``.
      checkpoints: a ``Checkpoints`` (or None to never save).
      outputs: a ``RunOutputs``.
      global_batch_size: examples per step (0: unknown, no throughput).
      learning_rate: ``step -> float``, logged with the train metrics.
      preview: ``(images, masks)`` to show predicted masks of at each eval, or None.
      verbose: print progress lines (the chief only).
      preemption: this task's ``Preemption`` (its ``requested`` is the vote to stop after the next chunk), or None.
      watchdog: a ``Watchdog`` told what runs and when each finished, or None.
      evaluates: evaluate at each epoch's end (False: the loop has nothing to evaluate).
      hooks: the client's ``Hooks``.
    """

    def __init__(self, *, loop, schedule: Schedule, checkpoints, outputs, global_batch_size, learning_rate,
                 preview=None, verbose=True, preemption=None, watchdog=None, evaluates=True, hooks: Hooks = Hooks()):
        self.loop = loop
        self.schedule = schedule
        self.checkpoints = checkpoints
        self.outputs = outputs
        self.steps = loop.steps
        self.evaluates = evaluates
        self.hooks = hooks
        self.global_batch_size = global_batch_size
        self.learning_rate = learning_rate
        self.preview = preview
        self.verbose = verbose
        self.preemption = preemption
        self.watchdog = watchdog
        self.train_seconds = 0.0
        self.timed_steps = 0
        self.last_train: dict | None = None
        self._bar = None
        self.first_step_at: float | None = None  # unix time the first chunk ended (start-up measurements)

    def _print(self, text: str) -> None:
        if self.verbose:
            if self._bar is not None:
                sys.stdout.write("\n")  # keep the bar's line; the text goes below it
            print(text, file=sys.stdout, flush=True)

    def _progress(self, step: int, loss: float) -> None:
        """A progress bar on a terminal (the chief only); logs stay line-based elsewhere."""
        if self._bar is not None:
            self._bar.update(step, values=[("loss", loss)], finalize=False)

    @contextlib.contextmanager
    def _phase(self, phase: str, step: int):
        """Tell the watchdog that ``phase`` runs, and that it finished (progress at ``step``)."""
        if self.watchdog is not None:
            self.watchdog.doing(phase)
        yield
        if self.watchdog is not None:
            self.watchdog.progress(step)

    def _save(self, step: int, window: StatsAccumulator, seconds: float) -> None:
        """Save ``step`` with the log window so far (its stats and seconds): a run resumed there logs as this one."""
        with self._phase("checkpointing", step):
            self.checkpoints.save(step, np.append(window.total, seconds))

    def evaluate(self, step: int) -> dict:
        """One eval pass; logged and returned."""
        with self._phase("evaluating", step):
            if self.hooks.eval_begin is not None:
                self.hooks.eval_begin()
            result = self.steps.metrics(self.loop.evaluate())
        self.outputs.log("eval", step, result)
        if self.preview is not None:
            images, masks = self.preview
            self.outputs.log_predictions(step, images, masks, self.loop.predict(images))
        self._print(f"eval   step {step}: {self.steps.describe('eval', result)}")
        return result

    def run(self, start_step: int) -> dict | None:
        """Train to the schedule's end (or until ``epoch_end`` says stop); returns the last eval metrics or None."""
        schedule, hooks = self.schedule, self.hooks
        total_steps = schedule.total_steps
        if self.verbose and sys.stdout.isatty():
            import keras

            self._bar = keras.utils.Progbar(total_steps, stateful_metrics=["loss"])
        step = start_step
        window = StatsAccumulator(self.steps.stats_size, self.steps.metrics)
        final = None
        window_seconds = 0.0
        carried = self.checkpoints.restored_window() if self.checkpoints else ()
        if len(carried) == self.steps.stats_size + 1:  # resumed between two log rows: the window goes on
            window.add(carried[:-1])
            window_seconds = float(carried[-1])
        first_chunk = True
        while step < total_steps:
            end = min(
                total_steps,
                step + schedule.steps_per_loop,
                next_boundary(step, schedule.log_every),
                next_boundary(step, schedule.checkpoint_every),
                next_boundary(step, schedule.steps_per_epoch),
            )
            if hooks.chunk_begin is not None:
                hooks.chunk_begin(step, end)
            t0 = time.perf_counter()
            with self._phase("first_step" if first_chunk else "training", end):
                stats, stop = self.loop.train(end - step, self._stop_requested)
            elapsed = time.perf_counter() - t0
            if hooks.clock is not None:
                hooks.clock.append((end, t0 + elapsed))
            if not first_chunk:  # the first chunk traces and compiles: not a speed figure
                self.train_seconds += elapsed
                self.timed_steps += end - step
            elif self.first_step_at is None:
                self.first_step_at = time.time()
            first_chunk = False
            if stop and stats[1] == 0:  # a coordinator stopped waiting for its closures: nothing to log
                self._preempted(self.loop.step(), total_steps, saved=False, window=(window, window_seconds))
            begin, step = step, end
            window_seconds += elapsed
            window.add(stats)
            chunk_loss = self.steps.metrics(stats).get("loss", 0.0)  # a model's own steps may track no "loss"
            self._progress(step, chunk_loss)
            if not math.isfinite(chunk_loss):
                last = self.checkpoints.latest() if self.checkpoints else None
                raise TrainingDiverged(
                    f"Training diverged: the loss is {chunk_loss} at step {step}. "
                    f"The last good checkpoint is kept: {last or 'none was saved yet'}. "
                    "Expected a finite loss; try a lower --learning_rate or --precision float32."
                )
            if hooks.chunk_end is not None:
                hooks.chunk_end(begin, step, window.result())
            if step % schedule.log_every == 0 or step == total_steps:
                result = window.result()
                # Train time only: evals and checkpoints in between are not counted.
                count = result[self.steps.count_key]
                result[self.throughput_key] = count / window_seconds if window_seconds > 0 else 0.0
                result["learning_rate"] = float(self.learning_rate(step))
                self.outputs.log("train", step, result)
                self.last_train = result
                self._print(f"train  step {step}/{total_steps}: {self.steps.describe('train', result)}  "
                            f"{result[self.throughput_key]:.1f} {self.steps.count_key}/s")
                window.reset()
                window_seconds = 0.0
            saved = bool(self.checkpoints) and (step % schedule.checkpoint_every == 0 or step == total_steps)
            if saved:
                self._save(step, window, window_seconds)
            if stop:
                self._preempted(step, total_steps, saved=saved, window=(window, window_seconds))
            hold_for_signal(begin, step, self.preemption, self.first_step_at)  # off unless a benchmark sets it
            if step % schedule.steps_per_epoch == 0:
                final = self.evaluate(step) if self.evaluates else None
                # Every task's answer is the same: a chief's callback may stop the run for all of them.
                if hooks.epoch_end is not None and self.loop.agree(bool(hooks.epoch_end(step, self.last_train, final))):
                    break
        if final is None and self.evaluates:  # nothing ran (resumed at the end): evaluate what was restored
            final = self.evaluate(step)
        return final

    def _stop_requested(self) -> bool:
        return self.preemption is not None and self.preemption.requested

    def _preempted(self, step: int, total_steps: int, *, saved: bool, window: tuple) -> NoReturn:
        """Every task agreed to stop after ``step``: save that step (every task, as for any save) and end, status 42."""
        if self.checkpoints and not saved:
            self._save(step, *window)
        where = f"{self.checkpoints.directory}/ckpt-{step}" if self.checkpoints else "no checkpoint (none asked for)"
        raise Preempted(
            f"Preempted at step {step} of {total_steps}: {self.preemption.reason()}. Saved the checkpoint of that "
            f"step: {where}. Run the same command again to resume from it."
        )

    @property
    def throughput_key(self) -> str:
        """The log's name for the throughput: what the steps count, per second (``images_per_second``)."""
        return f"{self.steps.count_key}_per_second"

    @property
    def throughput(self) -> float:
        """Examples (or images) per second of training after the first (compiling) chunk."""
        if self.timed_steps and self.train_seconds > 0:
            return self.timed_steps * self.global_batch_size / self.train_seconds
        return float("nan")
