"""The UNet's engine task: its steps, inputs and learning rate from the experiment's config."""

from __future__ import annotations

from typing import Sequence

from tfdist.engine.task import Hook, Task
from tfdist.segmentation.inputs import eval_dataset_fn, train_dataset_fn


def unet_task(config, state, *, total_steps: int, start_step: int, jit_compile: bool, coordinator: bool,
              hooks: Sequence[Hook] = (), preview: bool = False) -> Task:
    """The ``Task`` that trains ``state``'s UNet on ``config``'s data.

    Args:
      config: the experiment's config.
      state: the ``engine.state.TrainingState`` (model and optimizer, built).
      total_steps: the run's steps (the learning rate's schedule).
      start_step: the step the run starts at (the train pipeline skips what went before).
      jit_compile: XLA-compile the forward and backward pass.
      coordinator: the strategy has a coordinator (each worker reads the train split in its own order).
      hooks: the run's hooks.
      preview: add the mask preview (``segmentation.previews``) after them (the chief's).
    """
    from tfdist.segmentation.optimizers import learning_rate_at
    from tfdist.segmentation.previews import mask_preview
    from tfdist.segmentation.steps import Steps

    train = config.train
    steps = Steps(model=state.model, optimizer=state.optimizer, num_classes=config.data.num_classes,
                  global_batch_size=train.global_batch_size, jit_compile=jit_compile)
    train_fn = train_dataset_fn(config, start_step, own_order_per_worker=coordinator)
    eval_fn = eval_dataset_fn(config)
    return Task(steps=steps, train_dataset_fn=train_fn, eval_dataset_fn=eval_fn,
                learning_rate=lambda step: learning_rate_at(train, total_steps, step),
                global_batch_size=train.global_batch_size,
                hooks=(*hooks, mask_preview(config)) if preview else tuple(hooks))
