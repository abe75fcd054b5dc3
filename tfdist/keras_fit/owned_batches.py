"""A Python generator's or a ``PyDataset``'s batches across replicas are copies that TensorFlow owns.

Keras' data adapters hand a generator's numpy arrays to ``tf.data.Dataset.from_generator``, whose tensors share
the arrays' memory. A strategy of several replicas cuts each batch into replica slices, and TensorFlow takes a
slice of shared memory for its own: an element-wise op in the step (``F1Score``'s ``y_pred * y_true``) may then
write its result into the slice, into the user's arrays, and a generator that yields the same arrays again
trains the next epoch on labels the step overwrote (on one replica nothing is sliced and nothing is written).
Here each batch is copied as it leaves the adapter's Dataset, whenever Keras' epoch iterator distributes it over
more than one replica (``fit``, ``evaluate``, ``predict``); so is each batch of a user's own ``tf.data.Dataset``
that runs Python (``Dataset.from_generator``, ``tf.numpy_function``), whose tensors may share a generator's
arrays alike. On one replica Keras runs untouched.
"""

from __future__ import annotations

import contextvars
import functools

from tfdist import _compat

_across_replicas = contextvars.ContextVar("tfdist_across_replicas", default=False)


def install() -> None:
    """Wrap Keras' epoch iterator and the data adapters of Python batches (once per process)."""
    iterator = _compat.keras_tensorflow_trainer().TFEpochIterator
    if getattr(iterator.__init__, "tfdist_owned", False):
        return
    iterator.__init__ = _marking(iterator.__init__)
    for adapter in _compat.keras_python_data_adapters():
        adapter.get_tf_dataset = _copying(adapter.get_tf_dataset)
    adapter = _compat.keras_tf_dataset_adapter()
    adapter.get_tf_dataset = _copying(adapter.get_tf_dataset, only=runs_python)


def _marking(original):
    """``TFEpochIterator.__init__`` that marks whether its strategy splits each batch over several replicas."""

    @functools.wraps(original)
    def __init__(self, distribute_strategy=None, *args, **kwargs):
        replicas = getattr(distribute_strategy, "num_replicas_in_sync", 1)
        token = _across_replicas.set(replicas > 1)
        try:
            original(self, distribute_strategy, *args, **kwargs)
        finally:
            _across_replicas.reset(token)

    __init__.tfdist_owned = True
    return __init__


def _copying(original, only=lambda dataset: True):
    """An adapter's ``get_tf_dataset`` whose batches are copied (``owned``) while an iterator across replicas
    makes it, where ``only(dataset)``."""

    @functools.wraps(original)
    def get_tf_dataset(self):
        dataset = original(self)
        return owned(dataset) if _across_replicas.get() and only(dataset) else dataset

    return get_tf_dataset


#: The ops that run Python in a dataset's graph.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def runs_python(dataset) -> bool:
    """Whether ``dataset``'s graph runs Python (one that cannot be read for it counts as running Python)."""
    try:
        return bool(_compat.dataset_ops(dataset) & PYTHON_OPS)
    except Exception:  # noqa: BLE001 - a graph TensorFlow cannot serialize: copy, as for Python
        return True


def owned(dataset):
    """``dataset`` with each dense tensor of each element copied into memory TensorFlow allocates (``DeepCopy``);
    an optional, sparse or ragged component passes as it is."""
    import tensorflow as tf

    specs = tf.nest.flatten(dataset.element_spec)
    if not any(_dense(spec) for spec in specs):
        return dataset

    def copy(*element):
        flat = tf.nest.flatten(element, expand_composites=False)
        flat = [tf.raw_ops.DeepCopy(x=t) if _dense(spec) else t for t, spec in zip(flat, specs)]
        return tf.nest.pack_sequence_as(dataset.element_spec, flat)

    return dataset.map(copy, deterministic=True)


def _dense(spec) -> bool:
    import tensorflow as tf

    return type(spec) is tf.TensorSpec and spec.dtype != tf.variant
