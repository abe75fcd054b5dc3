"""A trained run's predicted mask for one image: read it, run the exported UNet, write the overlay and the mask.

TensorFlow and Keras are imported only when the model is loaded, so a bad image fails first and fast.
"""

from __future__ import annotations

from pathlib import Path

from tfdist.errors import UserError


def read_image(path: str | Path):
    """An RGB uint8 array, or a UserError naming the file."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError) as e:
        raise UserError(f"Cannot read image {path}: {type(e).__name__}: {e}. Expected a PNG or JPEG file.") from None


def load_exported_model(model_dir: str | Path):
    """The run's exported Keras model (``export/model.keras``), or a UserError saying what is missing."""
    from tfdist.rundir import RunDir

    path = RunDir(model_dir).exported_model
    if not path.is_file():
        raise UserError(
            f"Invalid --model_dir {model_dir}. Received a directory without export/model.keras. "
            "Expected the model_dir of a finished `python -m tfdist.train` run."
        )
    import keras

    import tfdist.models  # noqa: F401  (registers ReplicaBatchNorm for loading)

    return keras.models.load_model(path)


def predict_mask(model, image):
    """Class indices ``[H, W]`` at the image's own size: resized to the model's size, upsampled by nearest neighbour."""
    import numpy as np
    import tensorflow as tf

    size = model.input_shape[1]
    x = tf.image.resize(tf.cast(image[None], tf.float32) / 255.0, (size, size), method="bilinear")
    classes = tf.argmax(model(x, training=False), axis=-1, output_type=tf.int32)[0]
    full = tf.image.resize(classes[..., None], image.shape[:2], method="nearest")[..., 0]
    return np.asarray(full, dtype=np.uint8)


def predict_file(model_dir: str | Path, image_path: str | Path, overlay_path: str | Path,
                 mask_path: str | Path | None = None):
    """Write the predicted mask of ``image_path`` as a coloured overlay (and the class indices as a PNG); the mask.

    Raises:
        UserError: the image cannot be read, or ``model_dir`` has no exported model.
    """
    from PIL import Image

    from tfdist.visualize import overlay

    image = read_image(image_path)
    mask = predict_mask(load_exported_model(model_dir), image)
    Image.fromarray(overlay(image, mask)).save(overlay_path)
    if mask_path:
        Image.fromarray(mask).save(mask_path)
    return mask
