"""The parameter-server loop: a ``ClusterCoordinator`` on the chief schedules closures on free workers and
counts steps with a variable every closure increments.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import tensorflow as tf

from tfdist.engine.steps import Steps, counted_train_step
from tfdist import _compat

#: Seconds between two looks at the closures in flight (and at the preemption signal).
POLL_SECONDS = 0.005

#: Train steps one closure runs at most (``CoordinatorLoop(steps_per_closure=...)``).
STEPS_PER_CLOSURE = 1


class CoordinatorLoop:
    """Runs train steps on the workers of a ``ParameterServerStrategy`` and eval on the chief.

    Args:
      strategy: the ``ParameterServerStrategy``.
      steps: the replica functions.
      step_counter: an int64 variable (on a ps task) counting optimisation steps.
      train_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, repeated.
      eval_dataset: a finite local ``Dataset`` of batches, read on the chief.
      steps_per_closure: train steps one closure runs at most, one after another on its worker.
    """

    def __init__(self, *, strategy, steps: Steps, step_counter, train_dataset_fn, eval_dataset,
                 steps_per_closure: int = STEPS_PER_CLOSURE):
        self.strategy = strategy
        self.steps = steps
        self.step_counter = step_counter
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        # The form of TensorFlow's parameter-server tutorial: a tf.function that
        # each worker runs to build its own input pipeline.
        per_worker = self.coordinator.create_per_worker_dataset(
            tf.function(lambda: strategy.distribute_datasets_from_function(train_dataset_fn))
        )
        self._train_iterator = iter(per_worker)
        self._eval_dataset = eval_dataset
        self._size = steps.stats_size
        self._worker_fn = tf.function(self._worker_step)
        self._worker_steps_fn = tf.function(self._worker_steps)
        self.steps_per_closure = max(1, int(steps_per_closure))
        self._num_workers = _compat.num_input_pipelines(strategy)
        self._eval_fn = tf.function(self._eval_pass)
        self._closures: dict[int, int] = {}

    def _worker_step(self, iterator):
        stats = counted_train_step(self.strategy, self.steps, self.step_counter, iterator)
        return stats, tf.distribute.coordinator.experimental_get_current_worker_index()

    def _worker_steps(self, iterator, num_steps):
        total = tf.zeros([self._size], tf.float32)
        for _ in tf.range(num_steps):
            total += counted_train_step(self.strategy, self.steps, self.step_counter, iterator)
        return total, tf.distribute.coordinator.experimental_get_current_worker_index()

    def _closure_sizes(self, num_steps: int) -> list[int]:
        """Steps per closure for ``num_steps``: at most ``steps_per_closure``, and a closure for every worker."""
        if num_steps <= 0:
            return []
        closures = max(-(-num_steps // self.steps_per_closure), min(num_steps, self._num_workers))
        size, extra = divmod(num_steps, closures)
        return [size + 1] * extra + [size] * (closures - extra)

    def _schedule(self, size: int):
        if size == 1:
            return self.coordinator.schedule(self._worker_fn, args=(self._train_iterator,))
        return self.coordinator.schedule(self._worker_steps_fn, args=(self._train_iterator, tf.constant(size)))

    def _eval_pass(self, dataset):
        total = tf.zeros([self._size], tf.float32)
        for batch in dataset:
            total += self.steps.evaluate(batch)
        return total

    def train(self, num_steps: int, stop: Callable[[], bool] = lambda: False, chunk=None) -> tuple[np.ndarray, bool]:
        """Schedule ``num_steps`` closures and wait for all; returns their summed stats (numpy) and whether to stop.

        Its chunks do not grow (the closures are sized by ``steps_per_loop``): ``chunk`` is not read.

        The chief alone decides to stop (``stop()``, its preemption signal),
        and it does not wait for the closures in flight then: the workers
        may be preempted too, and a closure waiting for a lost worker would
        wait for its return. The variables live on the ps tasks, so the
        checkpoint saved next holds every update applied so far.
        """
        sizes = self._closure_sizes(num_steps)
        remote = [self._schedule(size) for size in sizes]
        while not self.coordinator.done():  # join(), but a preemption signal is seen while waiting
            if stop():
                return np.zeros([self._size], np.float32), True
            time.sleep(POLL_SECONDS)
        self.coordinator.join()  # raises what a closure raised
        results = [r.fetch() for r in remote]
        for (_, worker), size in zip(results, sizes):
            self._closures[int(worker)] = self._closures.get(int(worker), 0) + size
        return np.sum([stats for stats, _ in results], axis=0), stop()

    @staticmethod
    def agree(flag: bool) -> bool:
        """The chief alone decides (the workers only run closures): ``flag`` itself."""
        return flag

    def step(self) -> int:
        """The step counter's value (on a ps task): the closures that ran, re-runs included."""
        return int(self.step_counter.numpy())

    @property
    def closures_per_worker(self) -> dict[str, int]:
        """``{"worker:0": n, ...}``: the steps of the closures of this run whose result came from each worker.

        With one step per closure (the default) these are the closures themselves.
        """
        return {f"worker:{index}": count for index, count in sorted(self._closures.items())}

    def evaluate(self):
        """One pass over the eval split on the chief; returns the summed stats vector (numpy)."""
        return self._eval_fn(self._eval_dataset).numpy()

    def predict(self, images):
        """Logits for a small batch of images, on the chief."""
        return self.steps.model(images, training=False)
