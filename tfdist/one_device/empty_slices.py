"""A replica whose slice of the batch has no rows skips a conv net's convolutions, in both fits.

A last batch with fewer examples than replicas leaves a replica no rows. TensorFlow's oneDNN convolution gives an
empty batch an output of its input's shape, on which the activation's gradient fails ("ReluGrad ... Input 0:
[0,4,4,4] != input 1: [0,6,6,1]"). One device's step sums over the global batch, to which such a replica adds
nothing: while a step is traced, each convolution takes an empty output of its own shape in a ``tf.cond`` on an
empty slice, and the gradients flow through the ``cond`` (zeros). Every all-reduce (the gradients', the stats',
synchronized batch norm's) stays outside it, so every replica reaches them. A slice of known rows has no ``cond``.
"""

from __future__ import annotations

import contextlib
import functools

from tfdist import _compat

#: Keras' convolution layers, whose oneDNN kernels mis-shape an empty batch.
CONVOLUTIONS = ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
                "SeparableConv1D", "SeparableConv2D", "DepthwiseConv1D", "DepthwiseConv2D")


def _empty(output):
    """An output of no rows of ``output``'s type."""
    import tensorflow as tf

    return tf.zeros([0, *[d or 0 for d in output.shape[1:]]], output.dtype)


def _skipping_call(call):
    """A convolution's ``call`` that, on a slice of no rows inside a traced step, returns an empty output."""

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
def skipping_convolutions(model):
    """While a step over several replicas runs or is traced: each convolution of ``model`` skips an empty slice."""
    import keras

    convolutions = tuple(getattr(keras.layers, name) for name in CONVOLUTIONS if hasattr(keras.layers, name))
    several = model.distribute_strategy.num_replicas_in_sync > 1
    layers = [layer for layer in _compat.sublayers(model) if isinstance(layer, convolutions)] if several else []
    for layer in layers:
        layer.call = _skipping_call(type(layer).call.__get__(layer))
    try:
        yield
    finally:
        for layer in layers:
            vars(layer).pop("call", None)  # the class' own call shows again

