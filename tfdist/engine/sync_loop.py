"""The synchronous loop (one_device, mirrored, central_storage, multi_worker_mirrored): ``strategy.run``
inside ``tf.function``, several steps per call.
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
import tensorflow as tf

from tfdist.engine.chunks import ChunkSize
from tfdist.engine.steps import Steps, counted_train_step
from tfdist import _compat

#: What each replica appends to a train step's stats vector: its task's stop vote and proposed chunk steps.
TAIL = 2


def input_context(strategy) -> tf.distribute.InputContext:
    """The ``InputContext`` that ``distribute_datasets_from_function`` gives this worker's pipeline."""
    return tf.distribute.InputContext(
        num_input_pipelines=_compat.num_input_pipelines(strategy),
        input_pipeline_id=_compat.input_pipeline_id(strategy),
        num_replicas_in_sync=strategy.num_replicas_in_sync,
    )


def train_iterator(strategy, dataset_fn, options):
    """An iterator over this worker's training batches.

    With one replica on this worker (one_device, mirrored on one device, one
    CPU or GPU per multi_worker_mirrored worker) the worker's own pipeline,
    built with the same ``InputContext``, is iterated directly: its batch is
    that replica's batch: a distributed iterator makes the same train step
    much slower on the CPU (docs/benchmarks.md, Notes from profiling), even
    over a constant tensor. With several local replicas, the distributed dataset
    splits batches between them. Eval keeps the distributed dataset, which
    also lines up the uneven last batches of a finite split across workers.
    """
    if len(strategy.extended.worker_devices) == 1:
        with tf.device(strategy.extended.worker_devices[0]):
            return iter(dataset_fn(input_context(strategy)))
    return iter(strategy.distribute_datasets_from_function(dataset_fn, options))


class SyncLoop:
    """Runs train and eval steps under a synchronous strategy.

    Args:
      strategy: the ``tf.distribute.Strategy``.
      steps: the replica functions.
      step_counter: an int64 variable counting optimisation steps.
      train_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, repeated (None: it evaluates only,
        as an evaluator's loop under the default strategy does).
      eval_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, finite (None: no eval).
      several_steps: whether chunks run several steps (a ``Schedule`` that grows, or ``steps_per_loop`` > 1):
        then every chunk, one step long too, runs in the several-step function, which is traced once.
    """

    def __init__(self, *, strategy, steps: Steps, step_counter, train_dataset_fn, eval_dataset_fn,
                 several_steps: bool = False):
        self.strategy = strategy
        self.steps = steps
        self.step_counter = step_counter
        self._size = steps.stats_size
        options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
        self._train_iterator = (train_iterator(strategy, train_dataset_fn, options)
                                if train_dataset_fn is not None else None)
        self._eval_dataset = (strategy.distribute_datasets_from_function(eval_dataset_fn, options)
                              if eval_dataset_fn is not None else None)
        self._several_steps = several_steps
        self._train_fn = tf.function(self._train_steps)
        self._train_one_fn = tf.function(self._train_step)
        self._eval_fn = tf.function(self._eval_pass)
        self._agree_fn = tf.function(self._agree)

    def _train_step(self, iterator, tail):
        return counted_train_step(self.strategy, self.steps, self.step_counter, iterator, tail=tail)

    def _train_steps(self, iterator, num_steps, tail):
        # Each step's stats vector, as a row: the host sums them in float64, as it sums one-step chunks, so a
        # chunk's length changes no logged metric.
        # A loop's steps share a collective's key: one whose shape follows the batch (a sparse gradient's
        # gather) takes a key per step.
        stats = tf.TensorArray(tf.float32, size=tf.cast(num_steps, tf.int32), element_shape=[self._size + TAIL])
        with _compat.collective_keys_per_execution():
            for i in tf.range(tf.cast(num_steps, tf.int32)):
                stats = stats.write(i, self._train_step(iterator, tail))
        return stats.stack()

    def _eval_pass(self, dataset):
        # Iterating a distributed dataset inside tf.function makes tf.data warn
        # about reading options in graph mode; that is TensorFlow's own use.
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
        total = tf.zeros([self._size], tf.float32)
        for batch in dataset:
            per_replica = self.strategy.run(self.steps.evaluate, args=(batch,))
            total += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total

    def train(self, num_steps: int, stop: Callable[[], bool] = lambda: False,
              chunk: ChunkSize | None = None) -> tuple[np.ndarray, bool]:
        """Run ``num_steps`` steps; returns their summed stats vector (numpy) and whether to stop after them.

        This task's ``stop()`` is its vote, and ``chunk.proposal`` its
        proposed steps of a later chunk: each step's all-reduce sums them
        over every replica and worker, so every task gets the same answer,
        and ``chunk.agreed`` the same size (the replicas' mean proposal).
        """
        proposal = chunk.proposal if chunk is not None else 0
        tail = tf.constant([1.0 if stop() else 0.0, float(proposal)], tf.float32)
        if num_steps == 1 and not self._several_steps:
            rows = self._train_one_fn(self._train_iterator, tail).numpy()[None]
        else:
            rows = self._train_fn(self._train_iterator, tf.constant(num_steps, tf.int64), tail).numpy()
        total = np.zeros(self._size + TAIL, np.float64)
        for row in rows:  # in step order, as the controller adds one-step chunks
            total += row
        if chunk is not None:
            chunk.agreed(int(rows[-1][-1]) // self.strategy.num_replicas_in_sync)
        return total[:-TAIL], bool(total[-TAIL] > 0)

    def step(self) -> int:
        """The step counter's value."""
        return int(self.step_counter.numpy())

    def agree(self, flag: bool) -> bool:
        """Whether any task says ``flag`` (e.g. stop early): one all-reduce of one number, the same on every task."""
        return bool(self._agree_fn(tf.constant(1.0 if flag else 0.0, tf.float32)).numpy() > 0)

    def _agree(self, value):
        per_replica = self.strategy.run(tf.identity, args=(value,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def evaluate(self):
        """One pass over the eval split; returns the summed stats vector (numpy)."""
        return self._eval_fn(self._eval_dataset).numpy()

    def predict(self, images):
        """Logits for a small batch of images, on this process (for TensorBoard images)."""
        return self.steps.model(images, training=False)
