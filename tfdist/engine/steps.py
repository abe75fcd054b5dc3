"""The ``Steps`` protocol every client implements, and the counted train step: per-replica functions that
return one float32 stats vector each.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np


class Steps(Protocol):
    """The per-replica steps of one model, as the loops and the ``Controller`` use them."""

    #: The count in ``metrics``' result (``"images"``, ``"examples"``); throughput is this count per second.
    count_key: str

    @property
    def stats_size(self) -> int:
        """Length of a stats vector."""

    def train(self, batch) :
        """One optimisation step on this replica's batch; its stats vector."""

    def evaluate(self, batch) :
        """A forward pass on this replica's batch; its stats vector."""

    def metrics(self, stats) -> dict[str, float]:
        """The metrics of a stats vector summed over replicas, workers and steps (with ``count_key``)."""

    def describe(self, split: str, result: dict) -> str:
        """The metrics of one progress line for ``split`` (``"train"`` or ``"eval"``)."""


def counted_train_step(strategy, steps: Steps, step_counter, iterator, tail=None):
    """One train step on every replica of ``strategy``: counted, its stats vectors summed over replicas.

    The step both loops run (inside their ``tf.function``): the synchronous
    loop once per step of its loop, the parameter-server loop as one closure.

    ``tail`` (a float32 vector, or None) is appended to every replica's
    stats vector, so the sum that comes back ends with the sum of every
    replica's tail: the synchronous loop's stop vote (one worker's "stop
    here", ``runtime.preemption``) and chunk size (``engine.chunks``) reach
    every worker in the all-reduce the step makes anyway.
    """
    import tensorflow as tf

    train = steps.train if tail is None else (lambda batch: tf.concat([steps.train(batch), tail], axis=0))
    per_replica = strategy.run(train, args=(next(iterator),))
    step_counter.assign_add(1)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


class StatsAccumulator:
    """Sums stats vectors of ``size`` on the host between two reads; ``read(sum)`` gives the metrics.

    The controller makes one from its steps (``stats_size``, ``metrics``).
    """

    def __init__(self, size: int, read: Callable[[np.ndarray], dict]):
        self.size = size
        self.read = read
        self.reset()

    def reset(self) -> None:
        self._total = np.zeros(self.size, dtype=np.float64)

    def add(self, stats) -> None:
        self._total += np.asarray(stats, dtype=np.float64)

    def result(self) -> dict[str, float]:
        return self.read(self._total)

    @property
    def total(self):
        """The stats summed since the last reset."""
        return self._total.copy()
