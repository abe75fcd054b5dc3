"""The training state, built once for every client: model, optimizer and step counter under the strategy's
scope, and the run directory's latest checkpoint restored into them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from tfdist.engine.checkpoints import Checkpoints
from tfdist.rundir import RunDir


@dataclasses.dataclass(frozen=True)
class TrainingState:
    """What a run trains and checkpoints.

    Attributes:
      model: the Keras model, built under the strategy's scope.
      optimizer: its optimizer, built; None for a model whose own steps hold their optimizers.
      step: the step counter (an int64 ``tf.Variable``, counted by the loops).
      checkpoints: the run's ``Checkpoints`` of model, optimizer and step.
      restored: the checkpoint restored at the start, or None (a fresh start).
    """

    model: Any
    optimizer: Any
    step: Any
    checkpoints: Checkpoints
    restored: str | None

    def finalize_ema(self) -> None:
        """Write the optimizer's moving averages (``use_ema``) into the model, as Keras' ``fit`` does at its end.

        The checkpoints keep the trained weights and the averages apart, so a resumed run goes on from both.
        """
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        if inner is not None and getattr(inner, "use_ema", False):
            self.optimizer.finalize_variable_values(self.model.trainable_variables)

    def dump_weights(self, directory: str | Path, slug: str) -> Path:
        """Write the model's weights to ``directory/<slug>.npz`` (``worker-1.npz``, ``local.npz``): every task's
        final weights side by side, to compare tasks that write no outputs."""
        import numpy as np

        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / f"{slug}.npz"
        np.savez(path, *self.model.get_weights())
        return path

    def start(self) -> str:
        """Where the run starts, for its first line: ``resuming from <path> at step N`` or ``starting at step N``."""
        step = int(self.step.numpy())
        return f"resuming from {self.restored} at step {step}" if self.restored else f"starting at step {step}"


def build_state(strategy, build: Callable[[], tuple[Any, Any]], *, run_dir: RunDir, is_chief: bool,
                task: str) -> TrainingState:
    """Call ``build() -> (model, optimizer or None)`` under ``strategy``'s scope, add the step counter, restore.

    The optimizer's variables are made before the restore, so a checkpoint's
    slots land in them; the checkpoint holds ``model``, ``step`` and (when
    there is one) ``optimizer``.
    """
    import tensorflow as tf

    with strategy.scope():
        model, optimizer = build()
        if optimizer is not None:
            optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    parts = {"model": model, "optimizer": optimizer, "step": step}
    checkpoint = tf.train.Checkpoint(**{k: v for k, v in parts.items() if v is not None})
    checkpoints = Checkpoints(checkpoint=checkpoint, run_dir=run_dir, is_chief=is_chief, task=task)
    return TrainingState(model=model, optimizer=optimizer, step=step, checkpoints=checkpoints,
                         restored=checkpoints.restore_latest())
