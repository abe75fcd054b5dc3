"""The UNet's mask preview: at each eval, a few eval images beside their true and predicted masks, in TensorBoard."""

from __future__ import annotations

import numpy as np

from tfdist.engine.task import Hook
from tfdist.segmentation.inputs import local_eval_dataset
from tfdist.visualize import side_by_side

#: How many eval images the preview shows.
PREVIEW_IMAGES = 4


class MaskPreview(Hook):
    """Predicts ``masks`` of ``images`` after each eval and writes them as TensorBoard's ``image_true_predicted``.

    Args:
      images, masks: a small batch of eval images and their true masks.
    """

    def __init__(self, images, masks):
        self.images = images
        self.masks = masks

    def evaluated(self, step: int, result: dict, controller) -> None:
        predicted = np.argmax(np.asarray(controller.loop.predict(self.images)), axis=-1)
        grid = side_by_side(np.asarray(self.images), np.asarray(self.masks), predicted)
        controller.outputs.log_images("eval", step, "image_true_predicted", grid)


def mask_preview(config) -> MaskPreview:
    """The preview of the first ``PREVIEW_IMAGES`` images of ``config``'s eval split."""
    images, masks = next(iter(local_eval_dataset(config).unbatch().batch(PREVIEW_IMAGES).take(1)))
    return MaskPreview(images, masks)
