"""The outer loop, shared by every strategy (as Orbit's ``Controller``).

It asks a loop (``SyncLoop`` or ``CoordinatorLoop``) for chunks of steps that end
on every log, checkpoint and epoch boundary, and around them it logs, checks the
loss is finite, checkpoints and evaluates, knowing nothing of the strategy.
After each chunk it asks whether to stop (``training.preemption``): then every
task saves the checkpoint of the step reached and ends with ``Preempted``
(status 42), and the relaunched command resumes there.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import NoReturn

from tfdist.errors import Preempted, TrainingDiverged
from tfdist.training.metrics import StatsAccumulator


def next_boundary(step: int, every: int) -> int:
    """The first multiple of ``every`` after ``step``."""
    return (step // every + 1) * every


class Controller:
    """Drives ``loop`` from ``start_step`` to ``total_steps``.

    Args:
      loop: a ``training.loop.Loop`` (``train(n) -> stats``, ``evaluate() -> stats``, ``predict(images)``);
        its ``steps`` read the stats vectors (``metrics``, ``describe``, ``count_key``).
      checkpoints: a ``Checkpoints`` (or None to never save).
      outputs: a ``RunOutputs``.
      global_batch_size: images per step.
      steps_per_epoch, steps_per_loop, log_every, checkpoint_every: the schedule.
      learning_rate: ``step -> float``, logged with the train metrics.
      preview: ``(images, masks)`` to show predicted masks of at each eval, or None.
      verbose: print progress lines (the chief only).
      preemption: a ``training.preemption.Preemption`` (its ``requested`` is this task's vote to stop after
        the next chunk), or None.
      watchdog: a ``training.watchdog.Watchdog`` told what runs (training, evaluating, checkpointing) and
        when each finished (progress), or None.
      evaluates: evaluate at each epoch's end (False: the loop has nothing to evaluate).
      epoch_end: ``(step, train metrics of the epoch's last log window, eval metrics or None) -> stop?``,
        called at each epoch's end on every task (``tfdist.fit``'s callbacks and early stopping), or None;
        the run stops when any task says so (``loop.agree``).
      clock: a list to which ``(step, time.perf_counter())`` is appended at the end of every chunk, or None:
        a benchmark's timing window (``tfdist.bench`` times from the end of step W to the end of step W+N,
        as it times Keras' ``fit`` from its batch-end callbacks).
      chunk_begin: ``(step, end) -> None``, called before each chunk of steps ``[step, end)``, or None.
      chunk_end: ``(step, end, metrics of the log window so far) -> None``, called after each chunk, or None
        (``tfdist.fit``'s batch-level callbacks).
      eval_begin: ``() -> None``, called before each eval pass, or None (``tfdist.fit`` resets the metrics
        of a model with its own steps there, as Keras' ``evaluate`` does).
    """

    def __init__(self, *, loop, checkpoints, outputs, global_batch_size, steps_per_epoch,
                 steps_per_loop, log_every, checkpoint_every, learning_rate, preview=None, verbose=True,
                 preemption=None, watchdog=None, evaluates=True, epoch_end=None, clock=None, chunk_begin=None,
                 chunk_end=None, eval_begin=None):
        self.loop = loop
        self.checkpoints = checkpoints
        self.outputs = outputs
        self.steps = loop.steps
        self.evaluates = evaluates
        self.epoch_end = epoch_end
        self.clock = clock
        self.chunk_begin = chunk_begin
        self.chunk_end = chunk_end
        self.eval_begin = eval_begin
        self.global_batch_size = global_batch_size
        self.steps_per_epoch = steps_per_epoch
        self.steps_per_loop = steps_per_loop
        self.log_every = log_every
        self.checkpoint_every = checkpoint_every
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

    def _save(self, step: int) -> None:
        with self._phase("checkpointing", step):
            self.checkpoints.save(step)

    def evaluate(self, step: int) -> dict:
        """One eval pass; logged and returned."""
        with self._phase("evaluating", step):
            if self.eval_begin is not None:
                self.eval_begin()
            result = self.steps.metrics(self.loop.evaluate())
        self.outputs.log("eval", step, result)
        if self.preview is not None:
            images, masks = self.preview
            self.outputs.log_predictions(step, images, masks, self.loop.predict(images))
        self._print(f"eval   step {step}: {self.steps.describe('eval', result)}")
        return result

    def run(self, start_step: int, total_steps: int) -> dict | None:
        """Train to ``total_steps`` (or until ``epoch_end`` says stop); returns the last eval metrics (None: none)."""
        if self.verbose and sys.stdout.isatty():
            import keras

            self._bar = keras.utils.Progbar(total_steps, stateful_metrics=["loss"])
        step = start_step
        window = StatsAccumulator(self.steps.stats_size, self.steps.metrics)
        final = None
        window_seconds = 0.0
        first_chunk = True
        while step < total_steps:
            end = min(
                total_steps,
                step + self.steps_per_loop,
                next_boundary(step, self.log_every),
                next_boundary(step, self.checkpoint_every),
                next_boundary(step, self.steps_per_epoch),
            )
            if self.chunk_begin is not None:
                self.chunk_begin(step, end)
            t0 = time.perf_counter()
            with self._phase("first_step" if first_chunk else "training", end):
                stats, stop = self.loop.train(end - step, self._stop_requested)
            elapsed = time.perf_counter() - t0
            if self.clock is not None:
                self.clock.append((end, t0 + elapsed))
            if not first_chunk:  # the first chunk traces and compiles: not a speed figure
                self.train_seconds += elapsed
                self.timed_steps += end - step
            elif self.first_step_at is None:
                self.first_step_at = time.time()
            first_chunk = False
            if stop and stats[1] == 0:  # a coordinator stopped waiting for its closures: nothing to log
                self._preempted(self.loop.step(), total_steps, saved=False)
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
            if self.chunk_end is not None:
                self.chunk_end(begin, step, window.result())
            if step % self.log_every == 0 or step == total_steps:
                result = window.result()
                # Train time only: evals and checkpoints in between are not counted.
                count = result[self.steps.count_key]
                result["images_per_second"] = count / window_seconds if window_seconds > 0 else 0.0
                result["learning_rate"] = float(self.learning_rate(step))
                self.outputs.log("train", step, result)
                self.last_train = result
                self._print(f"train  step {step}/{total_steps}: {self.steps.describe('train', result)}  "
                            f"{result['images_per_second']:.1f} {self.steps.count_key}/s")
                window.reset()
                window_seconds = 0.0
            saved = bool(self.checkpoints) and (step % self.checkpoint_every == 0 or step == total_steps)
            if saved:
                self._save(step)
            if stop:
                self._preempted(step, total_steps, saved=saved)
            if step % self.steps_per_epoch == 0:
                final = self.evaluate(step) if self.evaluates else None
                # Every task's answer is the same: a chief's callback may stop the run for all of them.
                if self.epoch_end is not None and self.loop.agree(bool(self.epoch_end(step, self.last_train, final))):
                    break
        if final is None and self.evaluates:  # nothing ran (resumed at the end): evaluate what was restored
            final = self.evaluate(step)
        return final

    def _stop_requested(self) -> bool:
        return self.preemption is not None and self.preemption.requested

    def _preempted(self, step: int, total_steps: int, *, saved: bool) -> NoReturn:
        """Every task agreed to stop after ``step``: save that step (every task, as for any save) and end, status 42."""
        if self.checkpoints and not saved:
            self._save(step)
        where = f"{self.checkpoints.directory}/ckpt-{step}" if self.checkpoints else "no checkpoint (none asked for)"
        raise Preempted(
            f"Preempted at step {step} of {total_steps}: {self.preemption.reason()}. Saved the checkpoint of that "
            f"step: {where}. Run the same command again to resume from it."
        )

    @property
    def images_per_second(self) -> float:
        """Training throughput after the first (compiling) chunk."""
        if self.timed_steps and self.train_seconds > 0:
            return self.timed_steps * self.global_batch_size / self.train_seconds
        return float("nan")
