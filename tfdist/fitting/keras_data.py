"""Inputs read as Keras' own ``fit`` reads them: a ``PyDataset`` or a generator through Keras' data adapter (its
order, its workers, its epoch hooks; what the adapter cannot read refused in one line), and the order of numpy
rows under Keras' ``shuffle``."""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf

from tfdist import _compat
from tfdist.errors import UserError, short


def adapted(x, *, generator: bool, shuffle=False, class_weight=None, steps_per_epoch=None,
            evaluation: bool = False):
    """The ``tf.data.Dataset`` of the global batches that Keras' own data adapter makes of a PyDataset or (with
    ``generator``) a Python generator ``x``: its order, ``workers`` and ``use_multiprocessing``, class weights.

    A PyDataset's epoch is Keras' epoch, its hooks called as Keras' ``fit`` calls them (``on_epoch_end``
    once before the first epoch, or before each ``evaluation``, then ``on_epoch_begin`` and ``on_epoch_end``
    around each), its batch order drawn from Python's ``random`` at each epoch's start under ``shuffle``. A
    generator with ``steps_per_epoch`` streams as Keras' ``fit`` streams it; without, it trains one epoch
    (``args`` refuses more), which is read to its end now to count its batches, as Keras' first epoch does.
    """
    adapter = _compat.keras_data_adapter(x, shuffle=shuffle, class_weight=class_weight,
                                         steps_per_epoch=steps_per_epoch)
    keras_epoch = adapter.get_tf_dataset()  # Keras reads its first batches for their spec here, as its fit does
    if generator:
        if steps_per_epoch:
            return keras_epoch
        read = list(keras_epoch)
        dataset = tf.data.Dataset.from_generator(lambda: iter(read), output_signature=keras_epoch.element_spec)
        return dataset.apply(tf.data.experimental.assert_cardinality(len(read)))
    if not evaluation:
        adapter.on_epoch_end()  # Keras' fit resets its epoch iterator before the first epoch

    def epoch():
        if evaluation:
            adapter.on_epoch_end()  # Keras' evaluate resets it before each pass
        adapter.on_epoch_begin()
        try:
            yield from adapter.get_numpy_iterator()
        finally:
            adapter.on_epoch_end()

    dataset = tf.data.Dataset.from_generator(epoch, output_signature=keras_epoch.element_spec)
    if adapter.num_batches:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(adapter.num_batches))
    return dataset


def order(rows: int, batch_size: int, shuffle, seed: int):
    """The order in which Keras' ``fit`` reads ``rows`` numpy rows in batches of ``batch_size`` under ``shuffle``
    (``True``, or ``"batch"``: within each batch): every epoch, as its epochs read a new iterator of one seeded
    dataset.

    Keras' own data adapter draws it, over the row indices, with TensorFlow's random ops under the global seed
    (``keras.utils.set_random_seed``): the same permutation as its ``fit`` with that seed. Where no global seed
    is set (Keras would draw another order each run), it is drawn as under the global seed ``seed``, so that
    every worker reads the same order.
    """
    unseeded = _compat.global_seed() is None
    if unseeded:
        tf.random.set_seed(seed)
    try:
        adapter = _compat.keras_data_adapter(np.arange(rows), batch_size=batch_size, shuffle=shuffle)
        return np.concatenate([tf.nest.flatten(batch)[0].numpy() for batch in adapter.get_tf_dataset()])
    finally:
        if unseeded:
            tf.random.set_seed(None)


def check_py_dataset(name: str, value) -> None:
    """Refuse a ``keras.utils.PyDataset`` whose ``workers``, ``use_multiprocessing`` or ``max_queue_size`` Keras'
    data adapter cannot run with: a ``workers`` that is not a number (Keras compares it with 1), or, where Keras
    reads it with a pool (``workers > 1``, or ``> 0`` with ``use_multiprocessing``), a ``workers`` that is not a
    whole number or a ``max_queue_size`` that is not one (its queue waits for ever). What Keras' ``fit`` trains
    with (``workers=0`` or ``-1``: read in the loop; ``max_queue_size <= 0``: a queue without bound) passes.
    Anything else than a PyDataset passes.
    """
    import keras

    if not isinstance(value, keras.utils.PyDataset):
        return
    try:
        length = value.num_batches
    except Exception as e:  # noqa: BLE001 - the user's __len__
        raise UserError(f"Invalid `{name}`: its length cannot be read. Received: a {type(value).__name__} whose "
                        f"__len__ raised {type(e).__name__}: {short(str(e), 120)}. Expected __len__ to return the "
                        "number of batches (or no __len__ for a PyDataset without end, with steps_per_epoch).") from e
    if length is not None and (isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1):
        raise UserError(f"Invalid `{name}`: a {type(value).__name__} of {short(length, 40)} batches. Received: "
                        f"len({name}) == {short(length, 40)}. Expected at least one batch, as Keras' fit reads it.")
    workers, processes, queue = value.workers, value.use_multiprocessing, value.max_queue_size
    expected = ("Expected workers a whole number (1: read in the training loop; N > 1: N threads, or processes "
                "with use_multiprocessing) and max_queue_size a whole number (<= 0: no bound), as Keras' fit "
                "reads them.")
    if not isinstance(workers, numbers.Real):
        raise UserError(f"Invalid `{name}`: its `workers` is not a number. Received: a {type(value).__name__} with "
                        f"workers={short(workers, 40)}. {expected}")
    pooled = workers > 1 or (workers > 0 and bool(processes))
    if not pooled:
        return
    if not isinstance(workers, numbers.Integral):
        raise UserError(f"Invalid `{name}`: its `workers` is not a whole number. Received: a {type(value).__name__} "
                        f"with workers={workers!r}. {expected}")
    if isinstance(queue, bool) or not isinstance(queue, numbers.Integral):
        raise UserError(f"Invalid `{name}`: its `max_queue_size` is not a whole number. Received: a "
                        f"{type(value).__name__} with workers={workers!r} and max_queue_size={short(queue, 40)}. "
                        f"{expected}")


def read_by_keras(name: str, source, **kwargs):
    """``source.keras_batches(**kwargs)``: Keras' data adapter's first read of a PyDataset or generator ``name``
    (its first batches, for their type). What it refuses, what the user's ``__getitem__`` or generator raises
    there, and batches of a form Keras' ``fit`` does not take (``check_dataset_elements``) are one line naming
    ``name``, before the run directory's first write."""
    try:
        read = source.keras_batches(**kwargs)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - the user's own code, or Keras' refusal of its batches
        text = " ".join(str(e).split()) or type(e).__name__
        raise UserError(f"Invalid `{name}`: Keras' data adapter cannot read its first batches. Received: "
                        f"{type(e).__name__}: {text[:300]}. Expected a PyDataset or generator of (x,), (x, y) or "
                        "(x, y, sample_weight) batches of arrays with a dimension of examples, as Keras' fit "
                        "reads them.") from e
    if read.read_by_keras:
        check_dataset_elements(name, read.x, f"a {type(source.x).__name__} whose batches are")
    return read


def check_dataset_elements(name: str, dataset, kind: str = "a tf.data.Dataset") -> None:
    """A Dataset must yield batches as Keras' ``fit`` reads them: ``(x, y)``, ``(x, y, sample_weight)``, ``(x,)``
    or ``x`` alone (a tensor or a dict of them, for a model whose own ``train_step`` takes its inputs alone).

    A scalar part is a single example's (a batch has a dimension of examples): the Dataset was not batched. An
    empty Dataset (known to be) has no batch to train or validate on. ``kind``: what the user passed, in words.
    """
    spec = dataset.element_spec
    if isinstance(spec, tuple) and len(spec) not in (1, 2, 3):
        raise UserError(f"Invalid `{name}`: {kind} of {len(spec)}-tuples. Expected (x, y) or (x, y, sample_weight) "
                        "batches, or inputs x alone, as Keras' fit reads them.")
    if int(dataset.cardinality()) == 0:
        raise UserError(f"Invalid `{name}`: an empty tf.data.Dataset. Received: a Dataset of 0 elements. Expected "
                        "a Dataset of (x, y) batches with at least one batch.")
    scalars = [part for part in tf.nest.flatten(spec)
               if getattr(part, "shape", None) is not None and part.shape.rank == 0]
    if scalars:
        raise UserError(f"Invalid `{name}`: a tf.data.Dataset of single examples (a part of its elements is a "
                        f"scalar, {scalars[0]}). Expected a Dataset of (x, y) batches, e.g. dataset.batch(64), as "
                        "Keras' fit reads it.")
