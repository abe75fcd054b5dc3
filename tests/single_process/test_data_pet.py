"""Oxford-IIIT Pet through TFDS, offline: the real code path under tfds.testing.mock_data."""

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tfdist.segmentation.config import build_config
from tfdist.data import make_dataset, num_examples
from tfdist.data.oxford_iiit_pet import lock_path, prepare, trimap_to_classes
from tfdist.errors import UserError


def _pet(tmp_path, **overrides):
    return build_config(overrides={"dataset": "oxford_iiit_pet", "data_dir": str(tmp_path), "image_size": 32, **overrides}).data


def test_trimap_maps_to_three_classes_and_clips_outliers():
    trimap = tf.constant([0, 1, 2, 3, 4, 255], tf.uint8)
    np.testing.assert_array_equal(trimap_to_classes(trimap).numpy(), [0, 0, 1, 2, 2, 2])


def test_mock_pet_batches_at_the_configured_size(tmp_path):
    # mock_data's images and masks have random, different sizes and random mask bytes.
    data = _pet(tmp_path)
    with tfds.testing.mock_data(num_examples=5):
        train = make_dataset(data, "train", global_batch_size=2, seed=0, training=True)
        batches = list(train.take(4))
        evaluation = list(make_dataset(data, "eval", global_batch_size=2, seed=0, training=False))
        assert num_examples(data, "eval") == 5
    for images, masks in batches:
        assert images.shape == (2, 32, 32, 3) and images.dtype == tf.float32
        assert masks.shape == (2, 32, 32, 1) and masks.dtype == tf.int32
        assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
        assert 0 <= int(tf.reduce_min(masks)) and int(tf.reduce_max(masks)) <= 2
    assert [int(images.shape[0]) for images, _ in evaluation] == [2, 2, 1]  # eval: one pass, last batch partial
    all_masks = np.concatenate([m.numpy() for _, m in batches])
    assert set(np.unique(all_masks)) == {0, 1, 2}
    assert lock_path(Path(tmp_path)).exists()  # prepared under the lock in the data dir


class _SlowBuilder:
    """Prepares once, slowly, into ``root``; records how often and how concurrently."""

    def __init__(self, root: Path):
        self.root, self.prepared, self.calls, self.active, self.most_active = root, 0, 0, 0, 0
        self._count = threading.Lock()

    def download_and_prepare(self):
        with self._count:
            self.calls += 1
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if not (self.root / "prepared").exists():
                time.sleep(0.2)  # without the file lock, every caller gets here before anyone finishes
                (self.root / "prepared").write_text("done")
                self.prepared += 1
        finally:
            with self._count:
                self.active -= 1


def test_only_one_process_prepares_the_others_wait(tmp_path):
    builder = _SlowBuilder(tmp_path)
    callers = [threading.Thread(target=prepare, args=(builder, tmp_path)) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=30)
    assert builder.calls == 4
    assert builder.prepared == 1
    assert builder.most_active == 1  # nobody ran download_and_prepare while another held the lock
    assert lock_path(tmp_path).exists()


class _OfflineBuilder:
    data_dir = "/nowhere/oxford_iiit_pet/4.0.0"

    def download_and_prepare(self):
        raise ConnectionError("Failed to resolve 'thor.robots.ox.ac.uk'\n(Name or service not known)")


def test_download_failure_is_one_line_user_error(tmp_path):
    with pytest.raises(UserError, match=r"Cannot download or prepare the TFDS dataset oxford_iiit_pet") as info:
        prepare(_OfflineBuilder(), tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "ConnectionError" in message and "/nowhere/oxford_iiit_pet/4.0.0" in message and "tfds build" in message
