"""Keras' metric updates under ``CentralStorageStrategy``: each replica's addition counted once.

A Keras metric adds to its variables as ``variable.assign(variable + addition)`` (``assign_add`` too). Under
``CentralStorageStrategy`` with several replicas a variable is one ``AggregatingVariable`` for every replica,
and an assign in a replica context assigns the reduction of the replicas' values: with aggregation ``sum`` (a
metric's totals and counts) ``replicas * old + the additions``, at each update, so that Keras' own ``evaluate``
(and a model's own ``train_step``) reports other figures than one device. ``install`` makes such an assign add
this replica's change (``value - old``) with the ``AggregatingVariable``'s own ``assign_add``, which sums the
replicas' changes and adds them once: ``old + the additions``, what one device holds. Every replica reads
``old`` before the merged update runs. A variable without aggregation (batch norm's moving statistics),
which TensorFlow refuses to update in a replica context there, takes the mean of the replicas' values: the
value itself under synchronized batch norm, whose statistics are the global batch's on every replica; an
integer one (a ``keras.random.SeedGenerator``'s state) takes the value every replica advanced it to alike.
"""

from __future__ import annotations

import functools

from tfdist import _compat

#: Set on Keras' ``assign`` once ``install`` has wrapped it.
MARK = "tfdist_summed_once"


def install() -> None:
    """Wrap ``keras.Variable.assign`` (which ``assign_add`` and ``assign_sub`` call) once per process; idempotent."""
    import keras

    if not getattr(keras.Variable.assign, MARK, False):
        keras.Variable.assign = _summed_once(keras.Variable.assign)


def _summed_once(assign):
    """Keras' ``assign``, as an addition of this replica's change on a sum-aggregated ``AggregatingVariable``
    in a replica context."""
    import tensorflow as tf

    @functools.wraps(assign)
    def wrapped(self, value):
        aggregating = _compat.aggregating_value(self)
        if aggregating is None or tf.distribute.in_cross_replica_context():
            return assign(self, value)
        value = tf.cast(value, aggregating.dtype)
        if aggregating.aggregation == tf.VariableAggregation.NONE:
            return tf.distribute.get_replica_context().merge_call(
                lambda strategy, v: aggregating.assign(_one_value(strategy, v, aggregating.dtype)), args=(value,))
        if aggregating.aggregation != tf.VariableAggregation.SUM:
            return assign(self, value)
        aggregating.assign_add(value - aggregating.read_value())
        return value

    setattr(wrapped, MARK, True)
    return wrapped


def _one_value(strategy, value, dtype):
    """The value every replica assigned to a variable without aggregation, as one: batch norm's moving statistics
    are equal on every replica when synchronized and their mean otherwise; an integer state (a
    ``keras.random.SeedGenerator``'s) advances alike on every replica, and has no mean of its dtype."""
    import tensorflow as tf

    if dtype.is_floating:
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
    return strategy.experimental_local_results(value)[0]
