"""The UNet's engine plan: its steps, inputs and learning rate from the experiment's config, and its hook, the mask
preview (a few eval images beside their true and predicted masks, in TensorBoard)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tfdist import _compat
from tfdist.engine.plan import Hook, Plan
from tfdist.segmentation.inputs import eval_dataset_fn, local_eval_dataset, train_dataset_fn
from tfdist.visualize import side_by_side


def unet_plan(config, state, strategy, *, total_steps: int, start_step: int, coordinator: bool,
              hooks: Sequence[Hook] = (), preview: bool = False) -> Plan:
    """The ``Plan`` that trains ``state``'s UNet on ``config``'s data.

    Args:
      config: the experiment's config.
      state: the ``engine.state.TrainingState`` (model and optimizer, built).
      strategy: the run's ``tf.distribute.Strategy`` (whether XLA can compile the step: ``can_jit``).
      total_steps: the run's steps (the learning rate's schedule).
      start_step: the step the run starts at (the train pipeline skips what went before).
      coordinator: the strategy has a coordinator (each worker reads the train split in its own order).
      hooks: the run's hooks.
      preview: add the mask preview (``MaskPreview``) after them (the chief's).
    """
    from tfdist.segmentation.optimizers import learning_rate_at
    from tfdist.segmentation.steps import Steps

    train = config.train
    jit_compile = can_jit(config, strategy)
    hooks = (*hooks, mask_preview(config)) if preview else tuple(hooks)
    eval_fn = eval_dataset_fn(config)
    train_fn = train_dataset_fn(config, start_step, own_order_per_worker=coordinator)
    steps = Steps(model=state.model, optimizer=state.optimizer, num_classes=config.data.num_classes,
                  global_batch_size=train.global_batch_size, jit_compile=jit_compile)
    return Plan(steps=steps, train_dataset_fn=train_fn, eval_dataset_fn=eval_fn,
                learning_rate=lambda step: learning_rate_at(train, total_steps, step),
                global_batch_size=train.global_batch_size, hooks=hooks)


def can_jit(config, strategy) -> bool:
    """``--jit_compile``, where XLA can compile the forward and backward pass.

    With several replicas in sync, batch norm all-reduces its statistics
    inside the pass (a ``merge_call``), which a nested XLA function cannot
    hold; and with op determinism on, XLA lacks deterministic kernels. There
    the pass runs uncompiled and a warning says so.
    """
    if not config.runtime.jit_compile:
        return False
    from absl import logging

    if _compat.op_determinism_enabled():
        # As Keras does: XLA has no deterministic implementation of some ops (MaxPool's gradient).
        logging.warning("--jit_compile is ignored: op determinism is on (--deterministic) and XLA cannot honour it.")
        return False
    if strategy.num_replicas_in_sync > 1 and config.model.norm in ("batch", "replica_batch"):
        logging.warning(
            "--jit_compile is ignored with %d replicas and --norm %s: cross-replica statistics (batch or moving) "
            "cannot run inside an XLA-compiled step. Use --norm group or none, or one replica per worker, to compile.",
            strategy.num_replicas_in_sync, config.model.norm,
        )
        return False
    return True


#: How many eval images the preview shows.
PREVIEW_IMAGES = 4


class MaskPreview(Hook):
    """Predicts ``masks`` of ``images`` after each eval and writes them as TensorBoard's ``image_true_predicted``.

    Args:
      images, masks: a small batch of eval images and their true masks.
    """

    def __init__(self, images, masks):
        self.images = images
        self.masks = masks

    def evaluated(self, step: int, result: dict, controller) -> None:
        predicted = np.argmax(np.asarray(controller.loop.predict(self.images)), axis=-1)
        grid = side_by_side(np.asarray(self.images), np.asarray(self.masks), predicted)
        controller.outputs.log_images("eval", step, "image_true_predicted", grid)


def mask_preview(config) -> MaskPreview:
    """The preview of the first ``PREVIEW_IMAGES`` images of ``config``'s eval split."""
    images, masks = next(iter(local_eval_dataset(config).unbatch().batch(PREVIEW_IMAGES).take(1)))
    return MaskPreview(images, masks)
