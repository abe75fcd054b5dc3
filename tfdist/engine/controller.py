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
from tfdist.engine.chunks import ChunkSize, chunk_seconds
from tfdist.engine.steps import StatsAccumulator
from tfdist.engine.plan import Plan


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
    #: Whether the epoch that ends (counted from 1) is evaluated; the plan's eval runs after every epoch by default.
    evaluates_after: Callable[[int], bool] = lambda epoch: True
    #: Whether a chunk may join several ``steps_per_loop`` into one call of the loop (``engine.chunks``): only
    #: where no hook needs each loop's end (Keras callbacks without batch hooks).
    grow: bool = False


class Controller:
    """Drives ``loop`` from ``start_step`` to the schedule's ``total_steps``: train -> log -> checkpoint -> evaluate.

    Args:
      loop: a ``Loop`` (``engine.loop``) over the plan's steps.
      plan: the client's ``Plan`` (its steps' metrics, learning rate, hooks; whether it evaluates).
      schedule: a ``Schedule``; None for a controller that only evaluates (``evaluate``, as an evaluator's).
      checkpoints: a ``Checkpoints`` (or None to never save).
      outputs: a ``RunOutputs``.
      preemption: this task's ``Preemption`` (its ``vote()`` is the vote to stop after the next chunk), or None.
      watchdog: a ``Watchdog`` told what runs and when each finished, or None.
      verbose: print progress lines (the chief only).
    """

    def __init__(self, *, loop, plan: Plan, schedule: Schedule | None, checkpoints, outputs, preemption=None,
                 watchdog=None, verbose=True):
        self.loop = loop
        self.plan = plan
        self.schedule = schedule
        self.checkpoints = checkpoints
        self.outputs = outputs
        self.preemption = preemption
        self.watchdog = watchdog
        self.verbose = verbose
        self.steps = loop.steps
        self.train_seconds = 0.0
        self.timed_steps = 0
        self.last_train: dict | None = None
        self.first_step_at: float | None = None  # unix time the first chunk ended (start-up measurements)
        self.chunk_ended_at: float | None = None  # time.perf_counter() when the last chunk ended
        self.largest_chunk = 0  # the most steps one call of the loop ran: above steps_per_loop, chunks grew
        self._bar = None
        self._window = StatsAccumulator(self.steps.stats_size, self.steps.metrics)
        self._window_seconds = 0.0  # train seconds of the log window so far
        timeout = watchdog.timeout if watchdog is not None else 0.0
        self._chunk = (ChunkSize(schedule.steps_per_loop, grow=schedule.grow, seconds=chunk_seconds(timeout))
                      if schedule is not None else None)

    def run(self, start_step: int) -> dict | None:
        """Train to the schedule's end (or until a hook's ``epoch_end`` says stop); the last eval metrics or None.

        An epoch the schedule's ``evaluates_after`` skips shows no eval metrics to the hooks, and the run ends
        without an eval of its own after it, as Keras' ``validation_freq`` has it.
        """
        self._start(start_step)
        step, final, skipped = start_step, None, False  # skipped: an epoch the schedule does not evaluate
        while step < self.schedule.total_steps:
            begin, step = step, self._chunk_end(step)
            stop = self._train(begin, step)
            self._log(step)
            saved = self._checkpoint(step)
            if stop:
                self._preempted(step, saved=saved)
            for hook in self.plan.hooks:
                hook.chunk_done(begin, step, self)
            if step % self.schedule.steps_per_epoch == 0:
                due = self.schedule.evaluates_after(step // self.schedule.steps_per_epoch)
                skipped = skipped or (self.plan.evaluates and not due)
                evaluated = self.evaluate(step) if self.plan.evaluates and due else None
                final = evaluated if evaluated is not None else final
                if self._epoch_end(step, evaluated):
                    break
        if final is None and self.plan.evaluates and not skipped:
            final = self.evaluate(step)  # nothing ran (resumed at the end): evaluate what was restored
        return final

    def _start(self, start_step: int) -> None:
        """The progress bar on a terminal; the log window a resumed run carries on."""
        if self.verbose and sys.stdout.isatty():
            import keras

            self._bar = keras.utils.Progbar(self.schedule.total_steps, stateful_metrics=["loss"])
        carried = self.checkpoints.restored_window() if self.checkpoints else ()
        if len(carried) == self.steps.stats_size + 1:  # resumed between two log rows: the window goes on
            self._window.add(carried[:-1])
            self._window_seconds = float(carried[-1])

    def _chunk_end(self, step: int) -> int:
        """The end of the chunk from ``step``: the first loop (``ChunkSize``), log, checkpoint, epoch or run
        boundary after it."""
        schedule = self.schedule
        return min(schedule.total_steps, step + self._chunk.steps, next_boundary(step, schedule.log_every),
                   next_boundary(step, schedule.checkpoint_every), next_boundary(step, schedule.steps_per_epoch))

    def _train(self, begin: int, end: int) -> bool:
        """Train steps ``[begin, end)`` into the log window; whether the run must stop after them.

        Raises:
          Preempted: a coordinator stopped before any closure of the chunk returned.
          TrainingDiverged: the chunk's loss is not finite.
        """
        for hook in self.plan.hooks:
            hook.chunk_begin(begin, end)
        first_chunk = self.chunk_ended_at is None
        t0 = time.perf_counter()
        with self._phase("first_step" if first_chunk else "training", end, begin=begin):
            stats, stop = self.loop.train(end - begin, self._stop_requested, self._chunk)
        elapsed = time.perf_counter() - t0
        self.chunk_ended_at = t0 + elapsed
        self.largest_chunk = max(self.largest_chunk, end - begin)
        if not first_chunk:  # the first chunk traces and compiles: not a speed figure
            self.train_seconds += elapsed
            self.timed_steps += end - begin
            self._chunk.measured(end - begin, elapsed)
        elif self.first_step_at is None:
            self.first_step_at = time.time()
        if stop and stats[1] == 0:  # a coordinator stopped waiting for its closures: nothing to log
            self._preempted(self.loop.step(), saved=False)
        self._window_seconds += elapsed
        self._window.add(stats)
        chunk_loss = self.steps.metrics(stats).get("loss", 0.0)  # a model's own steps may track no "loss"
        self._progress(end, chunk_loss)
        if not math.isfinite(chunk_loss):
            last = self.checkpoints.latest() if self.checkpoints else None
            raise TrainingDiverged(
                f"Training diverged: the loss is {chunk_loss} at step {end}. "
                f"The last good checkpoint is kept: {last or 'none was saved yet'}. "
                "Expected a finite loss; try a lower --learning_rate or --precision float32."
            )
        for hook in self.plan.hooks:
            hook.chunk_end(begin, end, self._window.result())
        return stop

    def _log(self, step: int) -> None:
        """At a log boundary (or the run's end): the window's train row, with throughput and learning rate."""
        total_steps = self.schedule.total_steps
        if step % self.schedule.log_every and step != total_steps:
            return
        result = self._window.result()
        # Train time only: evals and checkpoints in between are not counted.
        count = result[self.steps.count_key]
        result[self.throughput_key] = count / self._window_seconds if self._window_seconds > 0 else 0.0
        result["learning_rate"] = float(self.plan.learning_rate(step))
        self.outputs.log("train", step, result)
        self.last_train = result
        self._print(f"train  step {step}/{total_steps}: {self.steps.describe('train', result)}  "
                    f"{result[self.throughput_key]:.1f} {self.steps.count_key}/s")
        self._window.reset()
        self._window_seconds = 0.0

    def _checkpoint(self, step: int) -> bool:
        """At a checkpoint boundary (or the run's end): save ``step``; whether it was saved."""
        every = self.schedule.checkpoint_every
        saved = bool(self.checkpoints) and (step % every == 0 or step == self.schedule.total_steps)
        if saved:
            self._save(step)
        return saved

    def evaluate(self, step: int, split: str = "eval") -> dict:
        """One eval pass of the weights at ``step``; logged as ``split`` (an evaluator's: ``"evaluator"``), shown
        to the hooks and returned."""
        with self._phase("evaluating", step):
            for hook in self.plan.hooks:
                hook.eval_begin()
            result = self.steps.metrics(self.loop.evaluate())
        self.outputs.log(split, step, result)
        for hook in self.plan.hooks:
            hook.evaluated(step, result, self)
        self._print(f"{split:<6} step {step}: {self.steps.describe('eval', result)}")
        return result

    def _epoch_end(self, step: int, evaluated: dict | None) -> bool:
        """The hooks' votes at an epoch's end; whether any task's hook stops the run (every task gets the same)."""
        votes = [hook.epoch_end(step, self.last_train, evaluated) for hook in self.plan.hooks]
        cast = [vote for vote in votes if vote is not None]
        return bool(cast) and self.loop.agree(any(bool(vote) for vote in cast))

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
    def _phase(self, phase: str, step: int, begin: int | None = None):
        """Tell the watchdog that ``phase`` runs (steps ``[begin, step)`` when it trains), and that it finished
        (progress at ``step``)."""
        if self.watchdog is not None:
            self.watchdog.doing(phase, until=step if begin is not None else None)
        yield
        if self.watchdog is not None:
            self.watchdog.progress(step)

    def _save(self, step: int) -> None:
        """Save ``step`` with the log window so far (its stats and seconds): a run resumed there logs as this one."""
        with self._phase("checkpointing", step):
            self.checkpoints.save(step, np.append(self._window.total, self._window_seconds))

    def _stop_requested(self) -> bool:
        return self.preemption is not None and self.preemption.vote()

    def _preempted(self, step: int, *, saved: bool) -> NoReturn:
        """Every task agreed to stop after ``step``: save that step (every task, as for any save) and end, status 42."""
        if self.checkpoints and not saved:
            self._save(step)
        where = f"{self.checkpoints.directory}/ckpt-{step}" if self.checkpoints else "no checkpoint (none asked for)"
        raise Preempted(
            f"Preempted at step {step} of {self.schedule.total_steps}: {self.preemption.reason()}. Saved the "
            f"checkpoint of that step: {where}. Run the same command again to resume from it."
        )

    @property
    def throughput_key(self) -> str:
        """The log's name for the throughput: what the steps count, per second (``images_per_second``)."""
        return f"{self.steps.count_key}_per_second"

    @property
    def throughput(self) -> float:
        """Examples (or images) per second of training after the first (compiling) chunk."""
        if self.timed_steps and self.train_seconds > 0:
            return self.timed_steps * self.plan.global_batch_size / self.train_seconds
        return float("nan")
