"""``segmentation.predict``: what it refuses before TensorFlow starts."""

from __future__ import annotations

import pytest

from tfdist.errors import UserError
from tfdist.segmentation import predict


def test_an_unreadable_image_and_a_run_without_its_model_are_user_errors(tmp_path):
    (tmp_path / "x.png").write_text("not an image")
    with pytest.raises(UserError, match="Cannot read image .*x.png"):
        predict.read_image(tmp_path / "x.png")
    with pytest.raises(UserError, match="without export/model.keras"):
        predict.load_exported_model(tmp_path)
