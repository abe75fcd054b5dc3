"""A Keras model built from the type of its data (a Dataset's ``element_spec``), never from a batch of it.

Reading a batch of the user's input before training starts an iteration of it: a Dataset that reshuffles each
iteration would show the first epoch its second order, and a stateful one would start early. A model with its
own ``call`` is built as Keras' symbolic build builds it (``keras.KerasTensor``s); one without (a GAN, a VAE
whose ``train_step`` calls its parts) from what its ``train_step`` creates, as Keras' ``fit`` builds it on one
device: tracing the step, under the model's strategy, with nothing run.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist import _compat

#: The rows a traced ``train_step`` sees where the data's type leaves them open (any number builds the same).
TRACE_ROWS = 2


def keras_tensors(spec):
    """``spec`` (a structure of ``tf.TensorSpec``) as ``keras.KerasTensor``s, for Keras' symbolic calls."""
    import keras

    return tf.nest.map_structure(lambda s: keras.KerasTensor(tuple(s.shape), s.dtype.name), spec)


def has_call(model) -> bool:
    """Whether ``model`` defines ``call`` (Keras' ``Model.call`` only raises)."""
    import keras

    return type(model).call is not keras.Model.call


def build(model, spec) -> None:
    """Build ``model``, its compiled loss and metrics and its optimizer(s) from data of type ``spec`` (one
    global batch as ``fit`` hands it to a step: ``(x, y[, sample_weight])`` or ``x`` alone): symbolically where
    the model has a ``call``, else by tracing its ``train_step``."""
    if has_call(model):
        _compat.symbolic_build(model, keras_tensors(spec))
    else:
        trace_train_step(model, spec)


def trace_train_step(model, spec) -> None:
    """Create every variable ``model.train_step`` creates (its parts', its optimizers', its metrics') by tracing
    it on one replica's data of type ``spec``, under the model's strategy; nothing of the step runs.

    Keras creates them while it traces its train function on one device. Under a strategy a layer's variable
    is made in the replica context of the trace, where a mirrored variable cannot initialize its copies from
    the first, and an optimizer's in the merge call of its ``apply``, in the trace's graph, where a strategy's
    creator of graph variables can fail (``CentralStorageStrategy`` compares a new trainable one, such as
    Nadam's ``u_product``, with the graph's others as a Python bool). So each is made outside the trace
    (``tf.init_scope``), as a variable made under ``strategy.scope()``: the creator is entered around
    ``strategy.run``, so that the replicas' threads copy it and their merge calls run under it.
    """
    strategy = model.distribute_strategy

    def shaped(s):
        shape = s.shape
        if shape.rank and shape[0] is None:
            shape = tf.TensorShape([TRACE_ROWS]).concatenate(shape[1:])
        return tf.TensorSpec(shape, s.dtype)

    def outside(next_creator, **kwargs):
        value = kwargs.get("initial_value")
        if isinstance(value, tf.Tensor) and not tf.executing_eagerly():  # a constant made in the trace's graph
            known = tf.get_static_value(value)
            if known is not None:
                kwargs["initial_value"] = known
        with tf.init_scope():
            return next_creator(**kwargs)

    def trace(data):
        with tf.variable_creator_scope(outside):  # the replicas' threads and their merge calls alike
            return strategy.run(model.train_step, (data,))

    with strategy.scope():
        tf.function(trace).get_concrete_function(tf.nest.map_structure(shaped, spec))


def zeros(spec):
    """Zeros of type ``spec`` (its unknown number of rows: ``TRACE_ROWS``), to build a compiled loss and metrics
    on values as they are built on numpy rows; None where a part's other dimensions are not known or it is not a
    plain tensor (those are built symbolically)."""
    parts = tf.nest.flatten(spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.rank and s.shape[1:].is_fully_defined() for s in parts):
        return None
    return tf.nest.map_structure(
        lambda s: tf.zeros([TRACE_ROWS if s.shape[0] is None else s.shape[0], *s.shape[1:]], s.dtype), spec)
