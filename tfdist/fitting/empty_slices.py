"""A replica whose slice of the batch has no rows skips a conv net's forward and backward pass, in both fits.

A last batch with fewer examples than replicas leaves a replica no rows. TensorFlow's oneDNN convolution gives an
empty batch an output of its input's shape, on which the activation's gradient fails ("ReluGrad ... Input 0:
[0,4,4,4] != input 1: [0,6,6,1]"). One device's step sums over the global batch, to which such a replica adds
nothing: it takes zeros in a ``tf.cond``, and every all-reduce (the gradients', the stats') stays outside it, so
every replica reaches them. A model whose forward pass all-reduces (batch norm: its statistics, or its moving
statistics) cannot skip it; it runs as before.
"""

from __future__ import annotations

import contextlib
import functools

from tfdist import _compat

#: Keras' convolution layers, whose oneDNN kernels mis-shape an empty batch.
CONVOLUTIONS = ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
                "SeparableConv1D", "SeparableConv2D", "DepthwiseConv1D", "DepthwiseConv2D")


def skips_empty_slices(model) -> bool:
    """Whether ``model`` has a convolution and no batch norm: a replica with no rows then skips its pass."""
    import keras

    layers = _compat.sublayers(model)
    convolutions = tuple(getattr(keras.layers, name) for name in CONVOLUTIONS if hasattr(keras.layers, name))
    return (any(isinstance(layer, convolutions) for layer in layers)
            and not any(isinstance(layer, keras.layers.BatchNormalization) for layer in layers))


def _rows(x):
    """``(static rows or None, rows as a tensor)`` of a batch ``x``."""
    import tensorflow as tf

    first = tf.nest.flatten(x)[0]
    return first.shape[0], tf.shape(first)[0]


def unless_empty(x, compute):
    """``compute()``'s ``(gradients, stats vector)`` on a slice with rows; on an empty one, zeros of their types.

    ``tfdist.fit``'s replica step: the optimizer's all-reduce and the stats' sum come after it, on every
    replica. A batch of known, non-zero rows runs ``compute`` without a ``cond``.
    """
    import tensorflow as tf

    static, rows = _rows(x)
    if static is not None and static > 0:
        return compute()
    built = {}

    def computed():
        grads, stats = compute()
        built["grads"], built["stats"] = grads, stats
        return [g for g in grads if g is not None], stats

    def skipped():
        return [_zeros(g) for g in built["grads"] if g is not None], tf.zeros(built["stats"].shape, tf.float32)

    present, stats = tf.cond(rows > 0, computed, skipped)
    present = iter(present)
    return [None if g is None else next(present) for g in built["grads"]], stats


def _zeros(value):
    """Zeros of ``value``'s type with no rows where it has rows: a gradient of a variable keeps its shape, an
    ``IndexedSlices`` has no slices (an optimizer updates it as sparse, as one device's)."""
    import tensorflow as tf

    if isinstance(value, tf.IndexedSlices):
        dense_shape = None if value.dense_shape is None else tf.constant(
            tf.get_static_value(value.dense_shape), value.dense_shape.dtype)
        return tf.IndexedSlices(tf.zeros([0, *value.values.shape[1:]], value.values.dtype),
                                tf.zeros([0], value.indices.dtype), dense_shape)
    return tf.zeros(value.shape, value.dtype)


def _empty(output):
    """An output of no rows of ``output``'s type (the model's predictions on an empty slice)."""
    import tensorflow as tf

    return tf.zeros([0, *[d or 0 for d in output.shape[1:]]], output.dtype)


def _skipping_call(call):
    """The model's ``call`` that, on a replica slice of no rows inside a step, returns empty predictions.

    Keras' own ``train_step`` then differentiates through the ``cond``: the empty replica's gradients are
    zeros, its loss and metric updates count no examples, and the optimizer all-reduces after, as ever.
    """

    @functools.wraps(call)
    def skipping(inputs, *args, **kwargs):
        import tensorflow as tf

        first = tf.nest.flatten(inputs)[0]
        if not (tf.is_tensor(first) and tf.inside_function()) or (first.shape[0] or 0) > 0:
            return call(inputs, *args, **kwargs)
        built = {}

        def computed():
            built["outputs"] = call(inputs, *args, **kwargs)
            return built["outputs"]

        def skipped():
            return tf.nest.map_structure(_empty, built["outputs"])

        return tf.cond(tf.shape(first)[0] > 0, computed, skipped)

    return skipping


@contextlib.contextmanager
def around(model, arguments, placement):
    """One Keras ``fit`` over several replicas of a conv net: its ``call`` skips an empty slice."""
    if model.distribute_strategy.num_replicas_in_sync < 2 or not skips_empty_slices(model):
        yield
        return
    model.call = _skipping_call(type(model).call.__get__(model))
    try:
        yield
    finally:
        vars(model).pop("call", None)  # the class' own call shows again
