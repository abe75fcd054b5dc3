"""What a client gives the engine, its ``Plan`` (Model Garden's task; "task" is a cluster's task here): its steps,
input functions, learning rate and hooks."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

from tfdist.engine.steps import Steps


class Hook:
    """What a client runs between chunks of steps, as a Keras callback is; every method here does nothing.

    A method that gets the ``controller`` reads the run from it: ``loop``
    (``predict``), ``outputs``, ``preemption``, ``first_step_at`` and
    ``chunk_ended_at``.
    """

    def chunk_begin(self, step: int, end: int) -> None:
        """Before the chunk of steps ``[step, end)``."""

    def chunk_end(self, step: int, end: int, window: dict) -> None:
        """After the chunk trained, before its log row; ``window``: the metrics of the log window so far."""

    def chunk_done(self, step: int, end: int, controller) -> None:
        """After the chunk's log row and checkpoint, before the epoch's eval."""

    def eval_begin(self) -> None:
        """Before each eval pass (a model's own metrics are reset there)."""

    def evaluated(self, step: int, result: dict, controller) -> None:
        """After each eval pass's log row."""

    def epoch_end(self, step: int, train: dict | None, evaluated: dict | None) -> bool | None:
        """At each epoch's end, on every task: True stops the run (any task's True stops all); None casts no vote.

        ``train`` holds the metrics of the epoch's last log row, ``evaluated``
        the epoch's eval metrics (None: no eval). A hook that votes must vote
        on every task: the votes meet in a collective.
        """
        return None


class Clock(Hook):
    """Appends ``(step, time.perf_counter(), time.process_time())`` at the end of every chunk to ``times``: a
    benchmark's window, on the wall clock and on the process's CPU time."""

    def __init__(self, times: list):
        self.times = times

    def chunk_done(self, step: int, end: int, controller) -> None:
        self.times.append((end, controller.chunk_ended_at, time.process_time()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """What the engine trains or evaluates: a client fills one in (the UNet experiment, ``tfdist.fit``).

    Attributes:
      steps: the per-replica ``Steps``.
      train_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, repeated.
      eval_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, finite; None: nothing to evaluate.
      learning_rate: ``step -> float``, logged with each train row.
      global_batch_size: examples a step (0: unknown, no throughput).
      hooks: the ``Hook``s run between chunks, in this order.
    """

    steps: Steps
    train_dataset_fn: Callable
    eval_dataset_fn: Callable | None
    learning_rate: Callable[[int], float]
    global_batch_size: int = 0
    hooks: Sequence[Hook] = ()

    @property
    def evaluates(self) -> bool:
        """Whether the plan has an eval split."""
        return self.eval_dataset_fn is not None
