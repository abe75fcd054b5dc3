"""The optimizer and its learning rate: scaling rule, warmup, decay, loss scaling, moving average.

``--learning_rate`` applies to the global batch; ``--lr_scaling linear``
multiplies it by ``global_batch / reference_batch`` (Goyal et al.),
``--warmup_steps`` ramps it up linearly and ``--lr_decay cosine`` decays it to 0
at the last step. Under ``mixed_float16`` the optimizer is a
``LossScaleOptimizer``; ``--ema_momentum`` keeps Keras' moving average of the
weights. The schedule reads the optimizer's ``iterations``, which under async
parameter-server training can lag the step count a little: that shifts the
schedule, never the step count.
"""

from __future__ import annotations

import math

import keras


def peak_learning_rate(train) -> float:
    """The learning rate after warmup, for a ``TrainConfig``."""
    if train.lr_scaling == "linear":
        return train.learning_rate * train.global_batch_size / train.reference_batch_size
    return train.learning_rate


@keras.saving.register_keras_serializable(package="tfdist")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to ``peak`` over ``warmup_steps``, then cosine decay to 0 at ``total_steps`` (if ``decay``)."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int, decay: bool):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = bool(decay)

    def __call__(self, step):
        ops = keras.ops
        step = ops.cast(step, "float32")
        lr = ops.convert_to_tensor(self.peak, "float32")
        if self.warmup_steps:
            lr = lr * ops.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
        if self.decay:
            span = float(max(1, self.total_steps - self.warmup_steps))
            progress = ops.clip((step - float(self.warmup_steps)) / span, 0.0, 1.0)
            lr = lr * 0.5 * (1.0 + ops.cos(math.pi * progress))
        return lr

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "decay": self.decay}


def learning_rate_at(train, total_steps: int, step: int) -> float:
    """The learning rate at ``step`` (for logs), as the schedule computes it."""
    schedule = WarmupCosine(peak_learning_rate(train), train.warmup_steps, total_steps, train.lr_decay == "cosine")
    return float(schedule(step))


def make_optimizer(train, precision: str, total_steps: int):
    """The Keras 3 optimizer for a ``TrainConfig``, precision policy name and run length."""
    lr = WarmupCosine(peak_learning_rate(train), train.warmup_steps, total_steps, train.lr_decay == "cosine")
    ema = {"use_ema": True, "ema_momentum": train.ema_momentum} if train.ema_momentum else {}
    if train.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=0.9, **ema)
    else:
        optimizer = keras.optimizers.Adam(learning_rate=lr, **ema)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
