"""Keras' optimizer across replicas, applied to the global batch's gradient: what one device applies.

Both fits use it, ``tfdist.fit``'s steps and Keras' own ``fit`` across workers, so it sits below both.
"""

from __future__ import annotations

import contextlib
import functools
import threading

from tfdist.strategies import traits_of

#: The methods of Keras' TensorFlow optimizer that reach other replicas, and Keras' one-device versions.
CROSS_REPLICA_METHODS = ("_backend_update_step", "_apply_weight_decay", "_backend_increment_gradient_accumulators",
                         "_overwrite_model_variables_with_average_value")

#: Set on an optimizer whose gradients arrive summed over replicas: its one-device methods run.
SUMMED = "_tfdist_summed_gradients"

#: This replica thread's share of the step's examples while a step runs (``loss_share``, ``replica_share``).
_share = threading.local()


def install() -> None:
    """Wrap Keras' TensorFlow optimizer (and ``LossScaleOptimizer``) once per process; idempotent."""
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
    losses = _compat.keras_loss_module()
    losses.scale_loss_for_distribution = _unless_shared(losses.scale_loss_for_distribution, scales=True)
    losses.unscale_loss_for_distribution = _unless_shared(losses.unscale_loss_for_distribution, scales=False)
    compile_loss = _compat.keras_compile_loss()
    compile_loss.call = _per_output(compile_loss.call)
    import tensorflow as tf

    tf.GradientTape.gradient = _scalar_loss_as_mean(tf.GradientTape.gradient)
    import keras

    keras.metrics.Mean.update_state = _scalar_mean_weighted(keras.metrics.Mean.update_state)


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

        examples = getattr(_share, "examples", None)
        if (examples is None or sample_weight is not None or getattr(_share, "scaled", False)
                or getattr(_share, "per_output", False) or tf.convert_to_tensor(values).shape.rank != 0):
            return update_state(self, values, sample_weight=sample_weight)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        weight = _cast(replicas * examples, values) / _cast(_share.total, values)
        return update_state(self, values, sample_weight=weight)

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
        examples = getattr(_share, "examples", None)
        if examples is None or getattr(_share, "scaled", False) or not tf.is_tensor(target) or target.shape.rank != 0:
            return grads
        share = _cast(examples, target) / _cast(_share.total, target)

        def weighted(g):
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(g.values * tf.cast(share, g.values.dtype), g.indices, g.dense_shape)
            return g if g is None else g * tf.cast(share, g.dtype)

        return tf.nest.map_structure(weighted, grads, expand_composites=False)

    return wrapped


def _per_output(call):
    """``CompileLoss.call``, during which an unscaled loss feeds a per-output tracker (``<output>_loss``).

    Keras counts each update of those trackers once, whatever the replica's examples, so there a replica's
    loss is ``replicas`` times its share of the step's examples times its mean: the replicas' updates then
    average to the global batch's mean, as one device's single update is.
    """

    @functools.wraps(call)
    def wrapped(self, *args, **kwargs):
        previous = getattr(_share, "per_output", False)
        _share.per_output = True
        try:
            return call(self, *args, **kwargs)
        finally:
            _share.per_output = previous

    return wrapped


def _unless_shared(scale, *, scales: bool):
    """Keras' loss scaling for N replicas, replaced while a replica's share is set.

    Under ``loss_share`` (Keras' own ``train_step``) a replica's mean loss is scaled by its share of the step's
    examples. Under ``replica_share`` (a model's own step) it is scaled by ``replicas`` times that share, so
    that a metric the step feeds it to, which counts each replica's update once, averages to one device's
    mean; its gradients are divided by the replicas after (``scales`` marks that such a loss was seen). Either
    way the gradients, those that flow through a cross-replica op included, are the global batch's.
    """

    @functools.wraps(scale)
    def wrapped(value):
        import tensorflow as tf

        share = weight = getattr(_share, "loss_weight", None)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if weight is None and getattr(_share, "examples", None) is not None:
            share = _cast(_share.examples, value) / _cast(_share.total, value)
            weight = replicas * share
            if scales:
                _share.scaled = True
        if weight is None:
            return scale(value)
        if scales:
            return value * _cast(weight, value)
        if getattr(_share, "per_output", False):  # a tracker that counts each replica's update once
            return value * tf.math.divide_no_nan(_cast(replicas * share, value), _cast(weight, value))
        return tf.math.divide_no_nan(value, _cast(weight, value))  # a replica without examples reports 0

    return wrapped


def _cast(weight, value):
    import tensorflow as tf

    return tf.cast(weight, tf.convert_to_tensor(value).dtype)


@contextlib.contextmanager
def loss_share(weight):
    """While Keras' own ``train_step`` runs on this replica: its loss is scaled by ``weight``, this replica's
    examples over the step's on every replica, in place of ``1 / replicas`` (one device's mean when a batch
    splits unevenly, through cross-replica ops such as synchronized batch norm too)."""
    previous = getattr(_share, "loss_weight", None)
    _share.loss_weight = weight
    try:
        yield
    finally:
        _share.loss_weight = previous


@contextlib.contextmanager
def replica_share(examples, total):
    """While a model's own step runs on this replica: its loss and gradients as one device's.

    ``examples`` is this replica's count of the step's examples, ``total`` the count on every replica. Keras
    divides a replica's mean loss by the replicas, so a step that feeds it to its own metric reports a
    fraction of the loss, and a batch split unevenly weighs each replica's mean alike. Here the loss the step
    sees is scaled by ``replicas * examples / total`` (1 on an even split), and its gradients, summed over the
    replicas, are divided by the replicas. Of a loss Keras does not scale, a scalar's gradients are weighted by
    ``examples / total`` (``_scalar_loss_as_mean``) and a per-example loss's kept as they are.
    """
    previous = (getattr(_share, "examples", None), getattr(_share, "total", None), getattr(_share, "scaled", False))
    _share.examples, _share.total, _share.scaled = examples, total, False
    try:
        yield
    finally:
        _share.examples, _share.total, _share.scaled = previous


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
    ``replica_share`` whose loss Keras would have scaled, the sum is divided by the replicas.
    """
    import tensorflow as tf

    SUM = tf.distribute.ReduceOp.SUM
    out = list(grads)
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
    # A model's own step under replica_share: its loss carried ``replicas`` times its share.
    weight = 1.0 / context.num_replicas_in_sync if getattr(_share, "scaled", False) else None

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
    @functools.wraps(step)
    def shared(data):
        import tensorflow as tf

        examples = tf.shape(tf.nest.flatten(data[0] if isinstance(data, tuple) else data)[0])[0]
        examples = tf.cast(examples, tf.float32)
        total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, examples)
        with replica_share(examples, total) if own else loss_share(examples / total):
            return step(data)

    return shared


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
