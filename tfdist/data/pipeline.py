"""One input pipeline for every dataset and every distribution strategy."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfdist.data.datasets import dataset
from tfdist.strategies import check_global_batch

SPLITS = ("train", "eval")


def _check_split(split: str) -> None:
    """Split names are fixed by tfdist; anything else is a programming error."""
    if split not in SPLITS:
        raise ValueError(f"Invalid split. Received: split={split!r}. Expected one of: {', '.join(SPLITS)}.")


def resize_and_normalise(image: tf.Tensor, mask: tf.Tensor, image_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The step every source shares: any-size uint8 pair -> model inputs at ``image_size``.

    Images are resized bilinearly and scaled to float32 in [0, 1]; masks are
    resized with nearest neighbour (class indices must not be blended) and
    cast to int32. The aspect ratio is not kept: both are squashed to a square.
    """
    size = (image_size, image_size)
    image = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")
    image = tf.clip_by_value(image / 255.0, 0.0, 1.0)
    mask = tf.image.resize(mask, size, method="nearest")
    image.set_shape([image_size, image_size, 3])
    mask.set_shape([image_size, image_size, 1])
    return image, tf.cast(mask, tf.int32)


def _source(data, split: str, seed: int) -> tf.data.Dataset:
    """The raw ``(uint8 image, uint8 mask)`` examples of ``data.dataset``, any size."""
    return dataset(data.dataset).split(data, split, seed)


def load_split(data, split: str, seed: int) -> tf.data.Dataset:
    """Unbatched ``(image float32 [S, S, 3] in [0, 1], mask int32 [S, S, 1])`` of one split.

    ``split`` is ``"train"`` or ``"eval"``; ``seed`` only matters for shapes
    (which split it generates). The order is fixed: no shuffling here.
    """
    _check_split(split)
    size = data.image_size
    return _source(data, split, seed).map(
        lambda image, mask: resize_and_normalise(image, mask, size),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def num_examples(data, split: str) -> int:
    """The examples in one pass of ``split`` (to size epochs); shapes from the config, others counted."""
    _check_split(split)
    row = dataset(data.dataset)
    if row.examples is not None:
        return row.examples(data, split)
    source = _source(data, split, seed=0)
    count = int(source.cardinality())
    if count < 0:  # unknown: count once (TFDS and folder sources know theirs)
        count = int(source.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    return count


def _per_replica_batch(global_batch_size: int, input_context: tf.distribute.InputContext | None) -> int:
    """The batch one replica gets; the global batch must split evenly over the replicas."""
    if input_context is None:
        return global_batch_size
    check_global_batch(global_batch_size, input_context.num_replicas_in_sync)
    return input_context.get_per_replica_batch_size(global_batch_size)


def _flip(seed: int) -> Callable:
    """A map fn: flip image and mask together, the coin keyed by ``(seed, global index)``."""

    def flip(index, example):
        image, mask = example
        coin = tf.random.stateless_uniform([], seed=tf.stack([tf.constant(seed, tf.int64), index]))
        flipped = coin < 0.5
        image = tf.where(flipped, tf.reverse(image, axis=[1]), image)
        mask = tf.where(flipped, tf.reverse(mask, axis=[1]), mask)
        return image, mask

    return flip


def _options() -> tf.data.Options:
    """Deterministic order and no auto-sharding (make_dataset shards explicitly)."""
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def make_dataset(
    data,
    split: str,
    *,
    global_batch_size: int,
    seed: int,
    training: bool,
    input_context: tf.distribute.InputContext | None = None,
) -> tf.data.Dataset:
    """The batches one input pipeline feeds: ``(float32 [b, S, S, 3], int32 [b, S, S, 1])``.

    ``b`` is the per-replica batch of ``input_context`` (the global batch when
    there is none). Training data repeats forever, shuffled with ``seed``, and
    is flipped when ``data.augment``; batches drop the remainder so every step
    has the same shape. Eval data is one pass in order, the last batch partial.
    """
    batch = _per_replica_batch(global_batch_size, input_context)
    ds = load_split(data, split, seed)
    if data.cache:
        ds = ds.cache()
    if training:
        ds = ds.repeat().shuffle(data.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    augment = training and data.augment
    if augment:
        ds = ds.enumerate()  # global position, carried through the shard for the flip
    if input_context is not None and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if augment:
        ds = ds.map(_flip(seed), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch, drop_remainder=training)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())


def dataset_fn(
    data, split: str, *, global_batch_size: int, seed: int, training: bool
) -> Callable[..., tf.data.Dataset]:
    """``make_dataset`` as a function of the input context.

    For ``strategy.distribute_datasets_from_function(fn)`` (called with an
    ``InputContext``) and for ``coordinator.create_per_worker_dataset(fn)``
    (called with none: each parameter-server worker reads the whole stream).
    """
    _check_split(split)

    def fn(input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        return make_dataset(
            data, split, global_batch_size=global_batch_size, seed=seed, training=training, input_context=input_context
        )

    return fn
