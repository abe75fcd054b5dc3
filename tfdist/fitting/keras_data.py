"""Inputs read as Keras' own ``fit`` reads them: a ``PyDataset`` or a generator through Keras' data adapter (its
order, its workers, its epoch hooks), and the order of numpy rows under Keras' ``shuffle``."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist import _compat


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
