"""Keras' optimizer across replicas, applied to the global batch's gradient: what one device applies.

The gradients are summed over the replicas before ``apply`` runs Keras' one-device code (clipping,
accumulation, weight decay, EMA), so that code sees the global batch's gradient and applies it once.
"""

from __future__ import annotations

import functools

from tfdist.one_device import shares
from tfdist.strategies import traits_of

#: The methods of Keras' TensorFlow optimizer that reach other replicas, and Keras' one-device versions.
CROSS_REPLICA_METHODS = ("_backend_update_step", "_apply_weight_decay", "_backend_increment_gradient_accumulators",
                         "_overwrite_model_variables_with_average_value")

#: Set on an optimizer whose gradients arrive summed over replicas: its one-device methods run.
SUMMED = "_tfdist_summed_gradients"


def install() -> None:
    """Wrap Keras' TensorFlow optimizer (and ``LossScaleOptimizer``) once per process; idempotent.

    Raises:
        UserError: this Keras' optimizer lacks a method the wrapping replaces or calls (``check``).
    """
    from keras.src.optimizers import base_optimizer
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    from tfdist import _compat

    tf_optimizer = _compat.keras_tensorflow_optimizer()
    if getattr(tf_optimizer.apply, "_tfdist", False):
        return
    check(tf_optimizer, base_optimizer.BaseOptimizer, LossScaleOptimizer)
    for name in CROSS_REPLICA_METHODS:
        setattr(tf_optimizer, name, _one_device_when_summed(getattr(tf_optimizer, name),
                                                            getattr(base_optimizer.BaseOptimizer, name)))
    tf_optimizer.apply = _summed_first(tf_optimizer.apply, loss_scale=False)
    LossScaleOptimizer.apply = _summed_first(LossScaleOptimizer.apply, loss_scale=True)


def check(tf_optimizer, base, loss_scale) -> None:
    """Refuse a Keras whose optimizer lacks a method the wrapping replaces or calls (one line, status 2)."""
    import keras

    from tfdist.errors import UserError

    missing = [f"{cls.__name__}.{name}" for cls, names in ((tf_optimizer, CROSS_REPLICA_METHODS),
                                                           (base, CROSS_REPLICA_METHODS + ("apply",)),
                                                           (loss_scale, ("apply", "_common_apply")))
               for name in names if not callable(getattr(cls, name, None))]
    if missing:
        raise UserError(
            f"Unsupported Keras {keras.__version__} for tfdist's optimizer across replicas: it has no "
            f"{', '.join(missing)}. Received: keras {keras.__version__}. Expected the optimizer of Keras 3.10 "
            "to 3.15."
        )


def _one_device_when_summed(distributed, one_device):
    """A method that runs Keras' one-device version on an optimizer marked ``SUMMED``, else its own."""

    @functools.wraps(distributed)
    def method(self, *args, **kwargs):
        return (one_device if getattr(self, SUMMED, False) else distributed)(self, *args, **kwargs)

    return method


def _replicas():
    """``(replica context, strategy)`` inside a distribution strategy's step, else ``(None, None)``."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or not tf.distribute.has_strategy():
        return None, None
    return context, tf.distribute.get_strategy()


def sum_over_replicas(context, grads):
    """``grads`` summed over every replica, each in the form one device hands the optimizer.

    A dense gradient is all-reduced. An ``IndexedSlices`` gradient (``Embedding``, ``tf.gather``) stays sparse:
    the replicas' slices are gathered in replica order, which is the global batch's order, so the optimizer's
    sparse update, and a clip of the slices, see the rows one device sees. ``None`` is kept. Under a
    ``shares.replica_share`` whose loss Keras scaled, the sum is divided by the replicas.
    """
    import tensorflow as tf

    SUM = tf.distribute.ReduceOp.SUM
    out = list(grads)
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
    # A model's own step under replica_share: its loss carried ``replicas`` times its share.
    weight = 1.0 / context.num_replicas_in_sync if shares.current().scaled else None

    def weighted(value):
        return value if weight is None else value * tf.cast(weight, value.dtype)

    if dense:
        for i, g in zip(dense, context.all_reduce(SUM, [weighted(grads[i]) for i in dense])):
            out[i] = g
    for i in sparse:
        g = grads[i]
        out[i] = tf.IndexedSlices(context.all_gather(weighted(g.values), axis=0),
                                  context.all_gather(g.indices, axis=0), g.dense_shape)
    return out


def _lives_once(strategy) -> bool:
    """Whether ``strategy`` keeps one copy of each variable that a replica cannot write (central storage, ps)."""
    known = traits_of(strategy)
    return known is not None and known.variables_elsewhere


def _summed_first(apply, *, loss_scale: bool):
    """``apply`` that sums the gradients over replicas before anything else, then runs the one-device code."""

    @functools.wraps(apply)
    def wrapped(self, grads, trainable_variables=None):
        context, strategy = _replicas()
        if context is None or _inside_summed(self):
            return apply(self, grads, trainable_variables)
        several, once = strategy.num_replicas_in_sync > 1, _lives_once(strategy)
        if not (several or once):  # one replica with its own variables: Keras' code is one device's
            return apply(self, grads, trainable_variables)
        grads = sum_over_replicas(context, list(grads)) if several else list(grads)
        _mark(self)
        if not once:
            return apply(self, grads, trainable_variables)

        def once(_, summed):
            local = strategy.experimental_local_results(summed)[0] if summed is not None else None
            if loss_scale:
                return self._common_apply(local, trainable_variables)
            return apply(self, local, trainable_variables)

        return context.merge_call(once, args=(grads,))

    wrapped._tfdist = True
    return wrapped


def _mark(optimizer) -> None:
    """Mark ``optimizer`` (and a loss-scale optimizer's inner one) as receiving summed gradients."""
    setattr(optimizer, SUMMED, True)
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        setattr(inner, SUMMED, True)
        setattr(inner, "_tfdist_outer_sums", True)


def _inside_summed(optimizer) -> bool:
    """Whether ``optimizer`` is the inner optimizer of a loss-scale optimizer that already summed its gradients."""
    return bool(getattr(optimizer, "_tfdist_outer_sums", False))


def refuse_accumulation_under_coordinator(optimizer, strategy_name: str) -> None:
    """Refuse gradient accumulation where workers apply their steps asynchronously (one line, status 2).

    Under a coordinator each worker's step applies to the parameter servers as it ends: the accumulators and the
    optimizer's step count are shared by steps of different workers racing each other, so which step applies
    the sum is not the one-device ``k``-th.
    """
    from tfdist.errors import UserError

    inner = getattr(optimizer, "inner_optimizer", optimizer)
    steps = getattr(inner, "gradient_accumulation_steps", None)
    if steps:
        raise UserError(
            f"Invalid optimizer for strategy={strategy_name!r}: gradient_accumulation_steps={steps}. Received "
            "gradient accumulation, whose accumulators every worker would update asynchronously and whose k-th "
            "step no worker can tell. Expected gradient_accumulation_steps=None under a coordinator (multiply "
            "the batch size by k instead), or a synchronous strategy such as 'multi_worker_mirrored'."
        )
