"""The optimizer and its learning rate: scaling rule, warmup, loss scaling.

``--learning_rate`` applies to the global batch as given. With
``--lr_scaling linear`` it is multiplied by ``global_batch / reference_batch``
(the linear scaling rule, Goyal et al. 2017) and ``--warmup_steps`` ramps it
up linearly from ``peak / warmup_steps`` to the peak. Under ``mixed_float16``
the optimizer is wrapped in Keras' ``LossScaleOptimizer`` (dynamic loss
scaling); bfloat16 needs none.
"""

from __future__ import annotations

import keras


def peak_learning_rate(train) -> float:
    """The learning rate after warmup, for a ``TrainConfig``."""
    if train.lr_scaling == "linear":
        return train.learning_rate * train.global_batch_size / train.reference_batch_size
    return train.learning_rate


@keras.saving.register_keras_serializable(package="tfdist")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """``peak * min(1, (step + 1) / warmup_steps)``."""

    def __init__(self, peak: float, warmup_steps: int):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        return self.peak * keras.ops.minimum(1.0, (step + 1.0) / float(self.warmup_steps))

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}


def learning_rate_at(train, step: int) -> float:
    """The learning rate at ``step`` (for logs), as the schedule computes it."""
    peak = peak_learning_rate(train)
    if train.warmup_steps:
        return peak * min(1.0, (step + 1) / train.warmup_steps)
    return peak


def make_optimizer(train, precision: str):
    """The Keras 3 optimizer for a ``TrainConfig`` and precision policy name."""
    peak = peak_learning_rate(train)
    lr = LinearWarmup(peak, train.warmup_steps) if train.warmup_steps else peak
    if train.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
    else:
        optimizer = keras.optimizers.Adam(learning_rate=lr)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
