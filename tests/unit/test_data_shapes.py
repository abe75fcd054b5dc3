"""The embedded shapes dataset: deterministic, valid, learnable-looking, any size.

How fast it generates is part of the default run's time, not asserted here
(speed is measured by benchmarks, never by a timed unit test).
"""

import numpy as np
import pytest

from tfdist.data import generate_shapes
from tfdist.data.shapes import NUM_CLASSES


def test_same_seed_same_arrays_other_seed_differs():
    a_images, a_masks = generate_shapes(12, 32, seed=7)
    b_images, b_masks = generate_shapes(12, 32, seed=7)
    c_images, c_masks = generate_shapes(12, 32, seed=8)
    np.testing.assert_array_equal(a_images, b_images)
    np.testing.assert_array_equal(a_masks, b_masks)
    assert not np.array_equal(a_images, c_images)
    assert not np.array_equal(a_masks, c_masks)


def test_masks_hold_valid_classes_and_every_class_appears():
    _, masks = generate_shapes(16, 32, seed=1)
    assert masks.dtype == np.uint8
    assert set(np.unique(masks)) == set(range(NUM_CLASSES))
    # 1-3 shapes per image, reasonably large: foreground covers a good share.
    per_image = (masks[..., 0] > 0).mean(axis=(1, 2))
    assert per_image.min() > 0.03 and per_image.mean() > 0.1


def test_shapes_contrast_with_background():
    images, masks = generate_shapes(16, 32, seed=2)
    for image, mask in zip(images.astype(float), masks[..., 0]):
        inside, outside = image[mask > 0].mean(axis=0), image[mask == 0].mean(axis=0)
        assert np.abs(inside - outside).max() > 40


@pytest.mark.parametrize("size", [32, 48, 96])
def test_any_image_size(size):
    images, masks = generate_shapes(5, size, seed=3)
    assert images.shape == (5, size, size, 3) and images.dtype == np.uint8
    assert masks.shape == (5, size, size, 1) and masks.dtype == np.uint8
    assert masks.max() < NUM_CLASSES
