"""``segmentation.predict``: the mask it computes from a model and an image."""

from __future__ import annotations

import numpy as np
import pytest

from tfdist.errors import UserError
from tfdist.segmentation import predict


def test_the_mask_is_the_models_argmax_at_the_images_own_size():
    import keras

    # 4x4 input, 2 classes: class 1 where the red channel is bright.
    inputs = keras.Input((4, 4, 3))
    model = keras.Model(inputs, keras.layers.Lambda(lambda x: keras.ops.stack([0.5 - x[..., 0], x[..., 0] - 0.5],
                                                                              axis=-1))(inputs))
    image = np.zeros((8, 6, 3), dtype=np.uint8)
    image[:4, :, 0] = 255
    mask = predict.predict_mask(model, image)
    assert mask.shape == (8, 6) and mask.dtype == np.uint8
    assert (mask[:4] == 1).all() and (mask[4:] == 0).all()


def test_a_damaged_export_is_one_user_error_naming_the_run(tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "model.keras").write_bytes(b"PK\x03\x04" + bytes(256))  # a zip's start, then nothing
    with pytest.raises(UserError, match=r"export/model.keras cannot be loaded"):
        predict.load_exported_model(tmp_path)
