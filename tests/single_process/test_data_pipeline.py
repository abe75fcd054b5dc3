"""The one pipeline: N input pipelines together equal one pipeline with the global batch."""

import collections
import dataclasses
import hashlib

import numpy as np
import pytest
import tensorflow as tf

from tfdist.segmentation.config import build_config
from tfdist.data import dataset_fn, load_split, make_dataset, num_examples
from tfdist.errors import UserError

DATA = build_config(
    overrides={"image_size": 16, "train_examples": 40, "eval_examples": 21, "shuffle_buffer": 64, "augment": False}
).data


def _context(pipeline_id, pipelines=2):
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=pipelines
    )


def _hash(image) -> str:
    return hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()


def _batches(ds, count=None):
    ds = ds.take(count) if count else ds
    return [(images.numpy(), masks.numpy()) for images, masks in ds]


def _hashes(batch):
    return collections.Counter(_hash(image) for image in batch[0])


def test_batches_have_the_contract_types():
    images, masks = _batches(make_dataset(DATA, "train", global_batch_size=4, seed=0, training=True), 1)[0]
    assert images.shape == (4, 16, 16, 3) and images.dtype == np.float32
    assert masks.shape == (4, 16, 16, 1) and masks.dtype == np.int32
    assert images.min() >= 0.0 and images.max() <= 1.0 and masks.max() <= 3


def test_two_pipelines_cover_eval_exactly_once():
    single = collections.Counter(_hash(image) for image, _ in load_split(DATA, "eval", seed=0).as_numpy_iterator())
    parts = [
        _batches(make_dataset(DATA, "eval", global_batch_size=4, seed=0, training=False, input_context=_context(p)))
        for p in range(2)
    ]
    assert [b[0].shape[0] for b in parts[0]] == [2, 2, 2, 2, 2, 1]  # per-replica batch 2, last partial
    union = sum((_hashes(b) for part in parts for b in part), collections.Counter())
    assert union == single and sum(union.values()) == 21 == num_examples(DATA, "eval")


@pytest.mark.parametrize("augment", [False, True])
def test_union_of_kth_batches_is_the_kth_global_batch(augment):
    data = dataclasses.replace(DATA, augment=augment)
    steps = 12  # 12 * 8 = 96 examples: more than two epochs of 40, across the repeat boundary
    whole = _batches(make_dataset(data, "train", global_batch_size=8, seed=3, training=True), steps)
    parts = [
        _batches(make_dataset(data, "train", global_batch_size=8, seed=3, training=True, input_context=_context(p)), steps)
        for p in range(2)
    ]
    for k in range(steps):
        assert parts[0][k][0].shape[0] == 4
        assert _hashes(parts[0][k]) + _hashes(parts[1][k]) == _hashes(whole[k])
        # Element-wise too: pipeline p holds global positions p, p + 2, ...
        np.testing.assert_array_equal(whole[k][1][0::2], parts[0][k][1])
        np.testing.assert_array_equal(whole[k][1][1::2], parts[1][k][1])


def test_training_order_follows_the_seed():
    first = _batches(make_dataset(DATA, "train", global_batch_size=8, seed=5, training=True), 2)
    again = _batches(make_dataset(DATA, "train", global_batch_size=8, seed=5, training=True), 2)
    other = _batches(make_dataset(DATA, "train", global_batch_size=8, seed=6, training=True), 2)
    np.testing.assert_array_equal(first[1][0], again[1][0])
    assert not np.array_equal(first[1][0], other[1][0])


def test_flip_moves_image_and_mask_together():
    data = dataclasses.replace(DATA, augment=True)
    truth = {}
    for image, mask in load_split(data, "train", seed=0).as_numpy_iterator():
        truth[_hash(image)] = (mask, False)
        truth[_hash(image[:, ::-1])] = (mask[:, ::-1], True)
    flips = []
    for images, masks in _batches(make_dataset(data, "train", global_batch_size=8, seed=0, training=True), 5):
        for image, mask in zip(images, masks):
            expected, flipped = truth[_hash(image)]
            np.testing.assert_array_equal(mask, expected)
            flips.append(flipped)
    assert any(flips) and not all(flips)


def test_options_turn_autoshard_off_and_keep_order():
    options = make_dataset(DATA, "eval", global_batch_size=4, seed=0, training=False).options()
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    assert options.deterministic is True


def test_dataset_fn_takes_a_context_or_none():
    fn = dataset_fn(DATA, "eval", global_batch_size=4, seed=0, training=False)
    assert _batches(fn(_context(1)), 1)[0][0].shape[0] == 2
    assert _batches(fn(), 1)[0][0].shape[0] == 4  # parameter-server workers: no context


def test_global_batch_must_split_over_replicas():
    with pytest.raises(UserError, match=r"global_batch_size=5 with 2 replicas"):
        make_dataset(DATA, "train", global_batch_size=5, seed=0, training=True, input_context=_context(0))


def test_unknown_dataset_is_a_user_error():
    with pytest.raises(UserError, match=r"dataset='mnist'"):
        load_split(dataclasses.replace(DATA, dataset="mnist"), "train", seed=0)
