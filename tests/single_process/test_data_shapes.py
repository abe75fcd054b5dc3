"""The shapes dataset's train and eval splits, through the input pipeline."""

import numpy as np

from tfdist.segmentation.config import build_config
from tfdist.data.shapes import shapes_split, split_seed


def test_train_and_eval_splits_differ():
    assert split_seed(0, "train") != split_seed(0, "eval")
    data = build_config(overrides={"image_size": 32, "train_examples": 8, "eval_examples": 8}).data
    train = next(iter(shapes_split(data, "train", seed=0).batch(8)))
    evaluation = next(iter(shapes_split(data, "eval", seed=0).batch(8)))
    assert not np.array_equal(train[0].numpy(), evaluation[0].numpy())

