"""Segmentation metrics from summed stats vectors (see ``steps.py``).

Every loop sums the per-replica stats vectors (over replicas, workers and
steps) and hands the sum here; loss, pixel accuracy and mean IoU follow from
it exactly, whatever the number of replicas. Mean IoU is computed as
``keras.metrics.MeanIoU`` does: the mean, over classes that occur in the
labels or the predictions, of TP / (TP + FP + FN).
"""

from __future__ import annotations

import numpy as np


def metrics_from_stats(stats, num_classes: int) -> dict[str, float]:
    """``{"loss", "pixel_accuracy", "mean_iou", "images"}`` from a summed stats vector."""
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
