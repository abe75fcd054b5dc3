"""The ``Loop`` protocol the controller drives (``SyncLoop`` or ``CoordinatorLoop``, ``runtime.run_loop.make_loop``'s
choice), whichever strategy runs."""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from tfdist.engine.chunks import ChunkSize


class Loop(Protocol):
    """Train and evaluate steps, each call returning the summed stats vector (``step.stats_size``)."""

    def train(self, num_steps: int, stop: Callable[[], bool] = lambda: False,
              chunk: ChunkSize | None = None) -> tuple[np.ndarray, bool]:
        """Run ``num_steps`` optimisation steps; their stats, summed over steps, replicas and workers.

        Also returns whether the run must stop after them: ``stop()`` says
        whether this task was asked to (``runtime.preemption``), and every
        task of the cluster gets the same answer. A loop whose chunks grow
        sends ``chunk.proposal`` with the steps and tells ``chunk.agreed``
        what every task agreed on, the same on each.
        """

    def step(self) -> int:
        """The step counter's value: the step the run has reached."""

    def agree(self, flag: bool) -> bool:
        """Whether any task of the cluster says ``flag``; every task gets the same answer."""

    def evaluate(self) -> np.ndarray:
        """One pass over the eval split; its stats, summed."""

    def predict(self, images: Any) -> Any:
        """Logits for a small batch of images, on this process (TensorBoard previews)."""
