"""Metrics from summed stats vectors agree with Keras' own metrics on the same predictions."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.engine.steps import StatsAccumulator
from tfdist.segmentation.steps import metrics_from_stats
from tfdist.segmentation.steps import per_image_loss, stats_size, step_stats


def _batch(seed, n=6, size=8, classes=4):
    rng = np.random.default_rng(seed)
    masks = rng.integers(0, classes, size=(n, size, size, 1)).astype(np.int32)
    logits = rng.normal(size=(n, size, size, classes)).astype(np.float32)
    # Make predictions partly right so IoU is not trivial.
    logits[..., 0] += 2.0 * (masks[..., 0] == 0)
    return masks, logits


@pytest.mark.parametrize("classes", [2, 4])
def test_mean_iou_accuracy_and_loss_match_keras(classes):
    acc = StatsAccumulator(stats_size(classes), lambda total: metrics_from_stats(total, classes))
    keras_iou = keras.metrics.MeanIoU(num_classes=classes)
    keras_acc = keras.metrics.Accuracy()
    losses = []
    for seed in range(3):  # summing over "steps" or "replicas" is the same operation
        masks, logits = _batch(seed, classes=classes)
        per_image = per_image_loss(masks, logits)
        acc.add(step_stats(masks, logits, per_image, classes).numpy())
        predicted = np.argmax(logits, axis=-1)
        keras_iou.update_state(masks[..., 0], predicted)
        keras_acc.update_state(masks[..., 0], predicted)
        losses.append(keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)(masks, logits))
    result = acc.result()
    assert result["mean_iou"] == pytest.approx(float(keras_iou.result()), rel=1e-6)
    assert result["pixel_accuracy"] == pytest.approx(float(keras_acc.result()), rel=1e-6)
    assert result["loss"] == pytest.approx(float(np.mean(np.concatenate([np.ravel(l) for l in losses]))), rel=1e-5)
    assert result["images"] == 18


def test_absent_classes_are_left_out_of_mean_iou_as_keras_does():
    masks = np.zeros((1, 4, 4, 1), np.int32)
    logits = np.zeros((1, 4, 4, 3), np.float32)
    logits[..., 0] = 1.0
    stats = step_stats(masks, logits, per_image_loss(masks, logits), 3).numpy()
    keras_iou = keras.metrics.MeanIoU(num_classes=3)
    keras_iou.update_state(masks[..., 0], np.argmax(logits, -1))
    assert metrics_from_stats(stats, 3)["mean_iou"] == pytest.approx(float(keras_iou.result())) == 1.0


def test_loss_is_averaged_per_image_then_over_the_global_batch():
    masks, logits = _batch(0, n=4)
    per_image = per_image_loss(masks, logits)
    assert per_image.shape == (4,)
    # Two replicas with half the batch each, scaled by the global batch, add up to one device's loss.
    halves = [tf.nn.compute_average_loss(per_image[i : i + 2], global_batch_size=4) for i in (0, 2)]
    whole = tf.nn.compute_average_loss(per_image, global_batch_size=4)
    assert float(sum(halves)) == pytest.approx(float(whole), rel=1e-6)


@pytest.mark.parametrize("label", [-1, 4])
def test_a_mask_label_outside_the_classes_fails_the_step(label):
    masks, logits = _batch(0, classes=4)
    masks[0, 0, 0, 0] = label
    step = tf.function(lambda masks, logits: step_stats(masks, logits, tf.zeros([6]), 4))  # as the loops run it
    for _ in range(20):  # the checks come first every time (they once raced bincount's own error and lost)
        with pytest.raises(tf.errors.InvalidArgumentError, match="mask labels must be"):
            step(masks, logits)
    with pytest.raises(tf.errors.InvalidArgumentError, match="mask labels must be"):  # eagerly too
        step_stats(masks, logits, tf.zeros([6]), 4)
