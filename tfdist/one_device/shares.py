"""A replica's share of the step's examples, and Keras' losses, trackers and gradients weighed by it.

While a step runs on a replica, ``loss_share`` (Keras' own ``train_step``) or ``replica_share`` (a model's own
step) holds this replica's share as one ``Share`` record in this thread's slot. ``install`` wraps Keras' loss
scaling, its compiled loss, ``GradientTape.gradient`` and ``keras.metrics.Mean`` to read it, so that N replicas
compute one device's loss, metrics and gradients where a batch splits unevenly. Outside such a step the record
is empty and Keras runs as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Any

#: Set on Keras' ``scale_loss_for_distribution`` once ``install`` has wrapped it.
MARK = "_tfdist_shared"


@dataclasses.dataclass
class Share:
    """This replica's share of the step's examples while a step runs (an empty record outside a step).

    Attributes:
      examples: this replica's count of the step's examples, under ``replica_share``; None otherwise.
      total: the step's count on every replica, under ``replica_share``.
      weight: the weight of this replica's loss in place of ``1 / replicas``, under ``loss_share``.
      per_output: a compiled loss is computing, whose per-output trackers count each replica's update once.
      scaled: Keras scaled this step's loss under ``replica_share`` (its gradients are divided by the replicas).
    """

    examples: Any = None
    total: Any = None
    weight: Any = None
    per_output: bool = False
    scaled: bool = False


class _Slot(threading.local):
    """Each thread's (each replica's) one record."""

    def __init__(self):
        self.share = Share()


_slot = _Slot()


def current() -> Share:
    """This replica thread's share of the step it runs."""
    return _slot.share


@contextlib.contextmanager
def _holding(share: Share):
    previous, _slot.share = _slot.share, share
    try:
        yield
    finally:
        _slot.share = previous


def loss_share(weight):
    """While Keras' own ``train_step`` runs on this replica: its loss is scaled by ``weight``, this replica's
    examples over the step's on every replica, in place of ``1 / replicas`` (one device's mean when a batch
    splits unevenly, through cross-replica ops such as synchronized batch norm too)."""
    return _holding(dataclasses.replace(current(), weight=weight))


def replica_share(examples, total):
    """While a model's own step runs on this replica: its loss and gradients as one device's.

    ``examples`` is this replica's count of the step's examples, ``total`` the count on every replica. Keras
    divides a replica's mean loss by the replicas, so a step that feeds it to its own metric reports a
    fraction of the loss, and a batch split unevenly weighs each replica's mean alike. Here the loss the step
    sees is scaled by ``replicas * examples / total`` (1 on an even split), and its gradients, summed over the
    replicas, are divided by the replicas (``optimizer.sum_over_replicas``). Of a loss Keras does not scale, a
    scalar's gradients are weighted by ``examples / total`` (``_scalar_loss_as_mean``) and a per-example loss's
    kept as they are.
    """
    return _holding(dataclasses.replace(current(), examples=examples, total=total, scaled=False))


def install() -> None:
    """Wrap Keras' loss scaling for N replicas, its compiled loss, ``tf.GradientTape.gradient`` and
    ``keras.metrics.Mean.update_state`` to read this replica's share, once per process; idempotent."""
    import keras
    import tensorflow as tf

    from tfdist import _compat

    losses = _compat.keras_loss_module()
    if getattr(losses.scale_loss_for_distribution, MARK, False):
        return
    losses.scale_loss_for_distribution = _unless_shared(losses.scale_loss_for_distribution, scales=True)
    losses.unscale_loss_for_distribution = _unless_shared(losses.unscale_loss_for_distribution, scales=False)
    compile_loss = _compat.keras_compile_loss()
    compile_loss.call = _per_output(compile_loss.call)
    tf.GradientTape.gradient = _scalar_loss_as_mean(tf.GradientTape.gradient)
    keras.metrics.Mean.update_state = _scalar_mean_weighted(keras.metrics.Mean.update_state)
    setattr(losses.scale_loss_for_distribution, MARK, True)


def _unless_shared(scale, *, scales: bool):
    """Keras' loss scaling for N replicas (``scales``) or its undoing for a tracker, replaced while a replica's
    share is set.

    Under ``loss_share`` (Keras' own ``train_step``) a replica's mean loss is scaled by its share of the step's
    examples. Under ``replica_share`` (a model's own step) it is scaled by ``replicas`` times that share, so
    that a metric the step feeds it to, which counts each replica's update once, averages to one device's
    mean; its gradients are divided by the replicas after (``scaled`` marks that such a loss was seen). Either
    way the gradients, those that flow through a cross-replica op included, are the global batch's.
    """

    @functools.wraps(scale)
    def wrapped(value):
        import tensorflow as tf

        record = current()
        share = weight = record.weight
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if weight is None and record.examples is not None:
            share = _cast(record.examples, value) / _cast(record.total, value)
            weight = replicas * share
            if scales:
                record.scaled = True
        if weight is None:
            return scale(value)
        if scales:
            return _scaled_for_the_step(value, weight)
        if record.per_output:
            return _unscaled_for_a_per_output_tracker(value, weight, replicas * share)
        return _unscaled_for_the_loss_tracker(value, weight)

    return wrapped


def _scaled_for_the_step(value, weight):
    """A replica's mean loss as the step differentiates it: times its weight."""
    return value * _cast(weight, value)


def _unscaled_for_the_loss_tracker(value, weight):
    """A scaled loss as Keras' loss tracker records it, weighing each replica's update by its examples: the
    replica's mean again (0 for a replica without examples)."""
    import tensorflow as tf

    return tf.math.divide_no_nan(value, _cast(weight, value))


def _unscaled_for_a_per_output_tracker(value, weight, counted_once):
    """A scaled loss as a per-output tracker (``<output>_loss``) records it, counting each replica's update once:
    ``counted_once`` (``replicas`` times the replica's share) times the replica's mean, so that the replicas'
    updates average to the global batch's mean."""
    import tensorflow as tf

    return value * tf.math.divide_no_nan(_cast(counted_once, value), _cast(weight, value))


def _per_output(call):
    """``CompileLoss.call``, during which an unscaled loss feeds a per-output tracker (``<output>_loss``).

    Keras counts each update of those trackers once, whatever the replica's examples, so there a replica's
    loss is ``replicas`` times its share of the step's examples times its mean: the replicas' updates then
    average to the global batch's mean, as one device's single update is.
    """

    @functools.wraps(call)
    def wrapped(self, *args, **kwargs):
        record = current()
        previous, record.per_output = record.per_output, True
        try:
            return call(self, *args, **kwargs)
        finally:
            record.per_output = previous

    return wrapped


def _scalar_loss_as_mean(gradient):
    """``GradientTape.gradient`` that, in a model's own step under ``replica_share`` whose loss Keras did not
    scale, weighs the gradients of a scalar target by the replica's share of the step's examples.

    Keras reads a scalar loss as a mean over the step's examples (a ``train_step`` computing ``ops.mean``, or a
    Keras loss with its default reduction, as the keras.io VAE and GANs do): one device's gradient is then the
    replicas' gradients weighted by their shares, which the sum over replicas adds up. A per-example loss (a
    vector, which the tape sums) keeps its gradients as they are.
    """

    @functools.wraps(gradient)
    def wrapped(self, target, sources, *args, **kwargs):
        import tensorflow as tf

        grads = gradient(self, target, sources, *args, **kwargs)
        record = current()
        if record.examples is None or record.scaled or not tf.is_tensor(target) or target.shape.rank != 0:
            return grads
        share = _cast(record.examples, target) / _cast(record.total, target)

        def weighted(g):
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(g.values * tf.cast(share, g.values.dtype), g.indices, g.dense_shape)
            return g if g is None else g * tf.cast(share, g.dtype)

        return tf.nest.map_structure(weighted, grads, expand_composites=False)

    return wrapped


def _scalar_mean_weighted(update_state):
    """``keras.metrics.Mean.update_state`` that, in a model's own step under ``replica_share`` whose loss Keras
    did not scale, weighs a scalar value without ``sample_weight`` by ``replicas`` times the replica's share
    of the step's examples.

    Such a value is the replica's mean over its slice (a ``train_step`` computing ``ops.mean``, as keras.io's
    VAE does), and one device's ``Mean`` adds the global batch's mean once a step. Each replica's update
    counts once, so unweighted the step's figure is the mean of the replicas' means, off one device's where
    a batch splits unevenly; weighted, the replicas' updates add up to ``replicas`` times the global batch's
    mean over a count of ``replicas``, one device's figure (1 on an even split: as it was). A loss Keras
    scaled (``_unless_shared``), a per-example vector and a weighted value are kept as they are.
    """

    @functools.wraps(update_state)
    def wrapped(self, values, sample_weight=None):
        import tensorflow as tf

        record = current()
        if (record.examples is None or sample_weight is not None or record.scaled or record.per_output
                or tf.convert_to_tensor(values).shape.rank != 0):
            return update_state(self, values, sample_weight=sample_weight)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        weight = _cast(replicas * record.examples, values) / _cast(record.total, values)
        return update_state(self, values, sample_weight=weight)

    return wrapped


def _cast(weight, value):
    import tensorflow as tf

    return tf.cast(weight, tf.convert_to_tensor(value).dtype)
