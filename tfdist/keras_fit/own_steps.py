"""Keras' own ``fit`` on several replicas: its steps, and a model's own, compute what one device computes.

Each step runs under this replica's share of the step's examples (``one_device.shares``), counted in the step.
"""

from __future__ import annotations

import contextlib
import functools

from tfdist.one_device.shares import loss_share, replica_share


def around(model, arguments, placement):
    """One Keras ``fit``: ``own_steps_as_one_device`` over the model's replicas."""
    return own_steps_as_one_device(model, model.distribute_strategy.num_replicas_in_sync)


@contextlib.contextmanager
def own_steps_as_one_device(model, replicas: int):
    """While Keras' own ``fit`` runs on several replicas: its steps compute what one device computes.

    Keras' own ``train_step`` and ``test_step`` run under ``loss_share`` of their slice (a last batch that
    splits unevenly weighs as one device's mean, each output's loss too). A model's own step runs under
    ``replica_share``: the loss it sees, and may feed its own metric, is the one device sees, and its
    gradients are weighted by the replica's share. Nothing changes for one replica.
    """
    import keras

    own = [name for name in ("train_step", "test_step")
           if getattr(type(model), name) is not getattr(keras.Model, name)] if replicas > 1 else []
    names = ["train_step", "test_step"] if replicas > 1 else []
    for name in names:
        setattr(model, name, _shared_step(getattr(type(model), name).__get__(model), own=name in own))
    try:
        yield
    finally:
        for name in names:
            vars(model).pop(name, None)  # the class' own step shows again


def _shared_step(step, *, own: bool):
    """``step`` under this replica's share of its data's examples: ``replica_share`` for a model's own step (``own``),
    else ``loss_share``."""
    @functools.wraps(step)
    def shared(data):
        import tensorflow as tf

        examples = tf.shape(tf.nest.flatten(data[0] if isinstance(data, tuple) else data)[0])[0]
        examples = tf.cast(examples, tf.float32)
        total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, examples)
        with replica_share(examples, total) if own else loss_share(examples / total):
            return step(data)

    return shared
