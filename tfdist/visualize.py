"""Masks as pictures: one palette for TensorBoard, predict and the notebooks."""

from __future__ import annotations

import numpy as np

#: RGB per class; class 0 (background) is black. Repeats past 10 classes.
PALETTE = np.array(
    [
        [0, 0, 0], [230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200],
        [245, 130, 48], [145, 30, 180], [70, 240, 240], [240, 50, 230], [210, 245, 60],
    ],
    dtype=np.uint8,
)


def colorize(mask) -> np.ndarray:
    """``[..., H, W]`` or ``[..., H, W, 1]`` class indices -> ``[..., H, W, 3]`` uint8 colours."""
    mask = np.asarray(mask)
    if mask.ndim >= 3 and mask.shape[-1] == 1:
        mask = mask[..., 0]
    return PALETTE[mask.astype(np.int64) % len(PALETTE)]


def overlay(image, mask, alpha: float = 0.5) -> np.ndarray:
    """Blend the coloured ``mask`` over ``image`` (uint8 or floats in [0, 1]); background stays clear."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        image = (np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8)
    colours = colorize(mask).astype(np.float32)
    m = np.asarray(mask)
    foreground = ((m[..., 0] if m.ndim == 3 else m) > 0)[..., None]
    blended = np.where(foreground, (1 - alpha) * image + alpha * colours, image)
    return blended.round().astype(np.uint8)


def side_by_side(images, true_masks, predicted_masks) -> np.ndarray:
    """``[N, H, 3W, 3]`` uint8 rows of image | true mask | predicted mask."""
    images = (np.clip(np.asarray(images), 0.0, 1.0) * 255).round().astype(np.uint8)
    return np.concatenate([images, colorize(true_masks), colorize(predicted_masks)], axis=2)
