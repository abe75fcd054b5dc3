"""Keras' additions to a variable under ``CentralStorageStrategy``: each replica's addition counted once.

Keras adds to a variable as ``assign(variable + value)``. Under ``CentralStorageStrategy`` with several replicas
a variable is one ``AggregatingVariable`` for every replica, and an assign in a replica context reduces the
replicas' values by the variable's aggregation: a metric's ``total`` and ``count`` (aggregation ``sum``) become
``replicas * old + the additions`` at each update, so that Keras' own ``evaluate`` (and a model's own
``train_step``) reports other figures than one device. The ``AggregatingVariable``'s own ``assign_add`` reduces
the additions alone and adds them once; ``install`` makes Keras' ``assign_add`` and ``assign_sub`` call it on such a
variable (for the other aggregations both agree: ``mean`` and ``only_first_replica`` of ``old + value``).
"""

from __future__ import annotations

import functools

from tfdist import _compat


def install() -> None:
    """Wrap ``keras.Variable.assign_add`` and ``assign_sub`` once per process; idempotent."""
    import keras

    if getattr(keras.Variable.assign_add, "_tfdist", False):
        return
    keras.Variable.assign_add = _added_once(keras.Variable.assign_add)
    keras.Variable.assign_sub = _added_once(keras.Variable.assign_sub)


def _added_once(method):
    """Keras' ``method`` (``assign_add`` or ``assign_sub``), through the ``AggregatingVariable``'s own
    ``assign_add`` where the Keras variable holds one."""

    @functools.wraps(method)
    def wrapped(self, value):
        aggregating = _compat.aggregating_value(self)
        if aggregating is None:
            return method(self, value)
        import tensorflow as tf

        return getattr(aggregating, method.__name__)(tf.cast(value, aggregating.dtype))

    wrapped._tfdist = True
    return wrapped
