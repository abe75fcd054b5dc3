"""A trained run's predicted mask for one image: read it, run the exported UNet, write the overlay and the mask.

TensorFlow and Keras are imported only when the model is loaded, so a bad image or output path fails first and
fast; each output is tried (created, then removed) before the model loads, so a path that cannot be written is
one line at the start, not a traceback after the work.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path

from tfdist.errors import UserError, special_file

#: What ``overlay_path`` (PNG or JPEG) and ``mask_path`` (class indices: lossless PNG) may end with, by the
#: flag that gives each.
OUTPUT_SUFFIXES = {"overlay_output": (".png", ".jpg", ".jpeg"), "mask_output": (".png",)}

#: The first bytes of a ``.keras`` file (a zip archive).
KERAS_SIGNATURE = b"PK\x03\x04"


def read_image(path: str | Path):
    """An RGB uint8 array, or a UserError naming the file.

    A file that is not a regular file (a FIFO nobody writes would block) and an image larger than Pillow's
    decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``, its warning included) are refused before decoding.
    """
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    expected = "Expected a PNG or JPEG file."
    special = special_file(path)
    if special:
        raise UserError(f"Invalid value for `--input_image`: {path} is {special}, not a regular file. "
                        f"Received: input_image={str(path)!r}. {expected}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return np.asarray(im.convert("RGB"))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise UserError(f"Invalid value for `--input_image`: {e} Received: input_image={str(path)!r}. Expected an "
                        f"image of at most {Image.MAX_IMAGE_PIXELS} pixels.") from None
    except (OSError, UnidentifiedImageError) as e:
        raise UserError(f"Cannot read image {path}: {type(e).__name__}: {e}. {expected}") from None


def check_output(name: str, path: str | Path) -> None:
    """Refuse an output path that cannot be written as an image, before anything starts (a UserError).

    The file is created (append mode: an existing one is left as it is) and, if it was not there, removed again:
    only a real write tells, as root passes ``os.access`` for paths the kernel refuses (``/proc``, ``/sys``).
    """
    suffixes = OUTPUT_SUFFIXES[name]
    path = str(path)
    parent = os.path.dirname(os.path.abspath(path))
    problem, special = None, special_file(path)
    if os.path.isdir(path):
        problem = "an existing directory"
    elif not path.lower().endswith(suffixes):
        problem = "a path without an image file extension"
    elif not os.path.isdir(parent):
        problem = f"a file in a directory that does not exist ({parent})"
    elif special:
        problem = f"{special}, not a regular file"
    else:
        existed = os.path.lexists(path)
        try:
            with open(path, "ab"):
                pass
        except OSError as e:
            problem = f"a file that cannot be written ({e.strerror or type(e).__name__})"
        else:
            if not existed:
                os.remove(path)
    if problem:
        raise UserError(f"Invalid value for `--{name}`. Received: {path!r}, {problem}. Expected a writable file "
                        f"path ending in {' or '.join(suffixes)} in an existing directory.")


def load_exported_model(model_dir: str | Path):
    """The run's exported Keras model (``export/model.keras``), or a UserError saying what is missing or broken."""
    from tfdist.rundir import RunDir

    path = RunDir(model_dir).exported_model
    expected = "Expected the model_dir of a finished `python -m tfdist.train` run."
    if not path.is_file():
        raise UserError(f"Invalid --model_dir {model_dir}. Received a directory without export/model.keras. "
                        f"{expected}")
    try:
        with open(path, "rb") as f:
            head = f.read(len(KERAS_SIGNATURE))
    except OSError as e:
        raise UserError(f"Cannot read {path}: {e.strerror or type(e).__name__}. {expected}") from None
    if head != KERAS_SIGNATURE:
        raise UserError(f"Invalid --model_dir {model_dir}: export/model.keras is not a Keras model file (a zip "
                        f"archive). Received: first bytes {head!r}. {expected}")
    import keras

    import tfdist.models.unet  # noqa: F401  (registers ReplicaBatchNorm for loading)

    try:
        return keras.models.load_model(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # a damaged or truncated archive
        raise UserError(f"Invalid --model_dir {model_dir}: export/model.keras cannot be loaded "
                        f"({type(e).__name__}: {e}). {expected}") from None


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
        UserError: an output cannot be written (``check_output``), the image cannot be read, or ``model_dir``
            has no exported model that loads; each before the model runs, and nothing is written then.
    """
    from PIL import Image

    from tfdist.visualize import overlay

    check_output("overlay_output", overlay_path)
    if mask_path:
        check_output("mask_output", mask_path)
    image = read_image(image_path)
    mask = predict_mask(load_exported_model(model_dir), image)
    Image.fromarray(overlay(image, mask)).save(overlay_path)
    if mask_path:
        Image.fromarray(mask).save(mask_path)
    return mask
