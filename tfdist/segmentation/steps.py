"""The per-replica train and eval steps that every tfdist loop runs.

Both loops call the same functions, so the math is written once: the loss is
per-pixel sparse cross-entropy averaged per image, divided by the *global* batch
size (``tf.nn.compute_average_loss``), so N replicas step as one device with the
global batch does; each step returns one float32 stats vector per replica,
``[loss_sum, images, confusion matrix (C*C, row = true, column = predicted)]``,
whose sum over replicas, workers and steps is all the metrics need
(``metrics_from_stats``), at one reduction per step.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def per_image_loss(masks, logits):
    """Sparse cross-entropy per pixel, averaged over each image's pixels: ``[B]``."""
    labels = tf.cast(tf.squeeze(masks, axis=-1), tf.int32)
    per_pixel = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))
    return tf.reduce_mean(per_pixel, axis=[1, 2])


def stats_size(num_classes: int) -> int:
    """Length of a stats vector for ``num_classes``."""
    return 2 + num_classes * num_classes


def metrics_from_stats(stats, num_classes: int) -> dict[str, float]:
    """``{"loss", "pixel_accuracy", "mean_iou", "images"}`` from a summed stats vector.

    Every loop sums the per-replica stats vectors (over replicas, workers and steps), so the metrics follow
    exactly, whatever the number of replicas. Mean IoU is ``keras.metrics.MeanIoU``'s: the mean, over classes
    that occur in the labels or the predictions, of TP / (TP + FP + FN).
    """
    stats = np.asarray(stats, dtype=np.float64)
    loss_sum, images = stats[0], stats[1]
    confusion = stats[2:].reshape(num_classes, num_classes)
    true_positive = np.diag(confusion)
    denominator = confusion.sum(axis=0) + confusion.sum(axis=1) - true_positive
    present = denominator > 0
    iou = np.divide(true_positive, denominator, out=np.zeros_like(true_positive), where=present)
    total = confusion.sum()
    return {
        "loss": float(loss_sum / images) if images else float("nan"),
        "pixel_accuracy": float(true_positive.sum() / total) if total else float("nan"),
        "mean_iou": float(iou[present].mean()) if present.any() else float("nan"),
        "images": int(images),
    }


def step_stats(masks, logits, per_image, num_classes: int):
    """``[loss_sum, images, confusion...]`` for one replica's batch.

    The confusion matrix is one ``bincount`` of ``true * C + predicted``: the same counts as
    ``tf.math.confusion_matrix`` at a smaller share of the step (``examples/profile_train_step.py``
    compares them). A label outside ``0..C-1`` fails the step, as in ``confusion_matrix``: ``bincount``
    alone would drop it.
    """
    labels = tf.reshape(tf.cast(masks, tf.int32), [-1])
    predicted = tf.reshape(tf.argmax(logits, axis=-1, output_type=tf.int32), [-1])
    # The checks come before the bincount (a control dependency), so that a negative label fails with the
    # check's message, never in bincount's own words ("Input arr must be non-negative!").
    checks = [tf.debugging.assert_non_negative(labels, message="mask labels must be >= 0"),
              tf.debugging.assert_less(labels, num_classes, message=f"mask labels must be < num_classes={num_classes}")]
    with tf.control_dependencies([check for check in checks if check is not None]):  # None: eager, already checked
        labels = tf.identity(labels)
    cells = num_classes * num_classes
    confusion = tf.cast(tf.math.bincount(labels * num_classes + predicted, minlength=cells, maxlength=cells),
                        tf.float32)
    head = tf.stack([tf.reduce_sum(per_image), tf.cast(tf.shape(per_image)[0], tf.float32)])
    return tf.concat([head, confusion], axis=0)


class Steps:
    """The replica functions for one model, optimizer and global batch size.

    Args:
      model: the Keras model (built under the strategy's scope).
      optimizer: a Keras 3 optimizer (a ``LossScaleOptimizer`` for float16).
      num_classes: classes per pixel.
      global_batch_size: images per step over all replicas.
      jit_compile: compile the forward and backward pass with XLA.
    """

    def __init__(self, *, model, optimizer, num_classes: int, global_batch_size: int, jit_compile: bool = False):
        self.model = model
        self.optimizer = optimizer
        self.num_classes = num_classes
        self.global_batch_size = global_batch_size
        self._gradients = (tf.function(self._forward_backward, jit_compile=True) if jit_compile
                           else self._forward_backward)

    def _forward_backward(self, images, masks):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            per_image = per_image_loss(masks, logits)
            loss = tf.nn.compute_average_loss(per_image, global_batch_size=self.global_batch_size)
            scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        return grads, logits, per_image

    #: The count in ``metrics``' result (throughput is ``count_key`` per second).
    count_key = "images"

    @property
    def stats_size(self) -> int:
        """Length of this steps' stats vector."""
        return stats_size(self.num_classes)

    def metrics(self, stats) -> dict[str, float]:
        """The metrics of a summed stats vector (``metrics_from_stats``)."""
        return metrics_from_stats(stats, self.num_classes)

    @staticmethod
    def describe(split: str, result: dict) -> str:
        """The metrics of one progress line: loss and mean IoU (and pixel accuracy for an eval)."""
        accuracy = f"  pixel_accuracy {result['pixel_accuracy']:.4f}" if split == "eval" else ""
        return f"loss {result['loss']:.4f}{accuracy}  mean_iou {result['mean_iou']:.4f}"

    def train(self, batch):
        """One optimisation step on this replica's batch; returns its stats vector."""
        images, masks = batch
        grads, logits, per_image = self._gradients(images, masks)
        self.optimizer.apply(grads, self.model.trainable_variables)
        return step_stats(masks, logits, per_image, self.num_classes)

    def evaluate(self, batch):
        """Forward pass in inference mode on this replica's batch; returns its stats vector."""
        images, masks = batch
        logits = self.model(images, training=False)
        return step_stats(masks, logits, per_image_loss(masks, logits), self.num_classes)
