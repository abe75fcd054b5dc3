"""The ``Loop`` protocol the controller drives (``SyncLoop`` or ``CoordinatorLoop``), whichever strategy runs."""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np


class Loop(Protocol):
    """Train and evaluate steps, each call returning the summed stats vector (``step.stats_size``)."""

    def train(self, num_steps: int, stop: Callable[[], bool] = lambda: False) -> tuple[np.ndarray, bool]:
        """Run ``num_steps`` optimisation steps; their stats, summed over steps, replicas and workers.

        Also returns whether the run must stop after them: ``stop()`` says
        whether this task was asked to (``runtime.preemption``), and every
        task of the cluster gets the same answer.
        """

    def step(self) -> int:
        """The step counter's value: the step the run has reached."""

    def agree(self, flag: bool) -> bool:
        """Whether any task of the cluster says ``flag``; every task gets the same answer."""

    def evaluate(self) -> np.ndarray:
        """One pass over the eval split; its stats, summed."""

    def predict(self, images: Any) -> Any:
        """Logits for a small batch of images, on this process (TensorBoard previews)."""


def make_loop(*, coordinator: bool, strategy, steps, step_counter, train_dataset_fn, eval_dataset_fn) -> Loop:
    """The loop for a strategy: ``CoordinatorLoop`` when it has a coordinator, else ``SyncLoop``.

    Args:
        coordinator: the strategy's ``Traits.coordinator``.
        strategy, steps, step_counter: as both loops take them.
        train_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, repeated.
        eval_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, finite (None: no eval);
            the coordinator reads it as one local pipeline.
    """
    if coordinator:
        import tensorflow as tf

        from tfdist.engine.coordinator_loop import CoordinatorLoop

        return CoordinatorLoop(strategy=strategy, steps=steps, step_counter=step_counter,
                               train_dataset_fn=train_dataset_fn,
                               eval_dataset=eval_dataset_fn(tf.distribute.InputContext()) if eval_dataset_fn else None)
    from tfdist.engine.sync_loop import SyncLoop

    return SyncLoop(strategy=strategy, steps=steps, step_counter=step_counter,
                    train_dataset_fn=train_dataset_fn, eval_dataset_fn=eval_dataset_fn)
