"""``python -m tfdist.predict``: a trained run's predicted mask for one image, as a coloured overlay.

    python -m tfdist.predict --model_dir runs/mirrored --image cat.png --output cat_mask.png

Reads ``model_dir/export/model.keras`` and the image size from
``model_dir/params.yaml``; the image is resized to the model's size, and the
overlay is written at the image's own size (mask upsampled by nearest
neighbour). ``--mask_output`` also writes the raw class indices as a PNG.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from absl import flags  # noqa: E402

from tfdist.errors import UserError, run_main  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("model_dir", None, "A tfdist run directory (with export/model.keras).")
    flags.DEFINE_string("image", None, "The input image (PNG or JPEG).")
    flags.DEFINE_string("output", None, "Where to write the overlay PNG.")
    flags.DEFINE_string("mask_output", None, "Optional: where to write the class-index mask PNG.")


#: What ``--output`` (an overlay: PNG or JPEG) and ``--mask_output`` (class indices: lossless PNG) may end with.
OUTPUT_SUFFIXES = {"output": (".png", ".jpg", ".jpeg"), "mask_output": (".png",)}


def check_output(name: str, path: str) -> None:
    """Refuse an output path that cannot be written as an image, before anything starts (a UserError)."""
    import os

    suffixes = OUTPUT_SUFFIXES[name]
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        problem = "an existing directory"
    elif not path.lower().endswith(suffixes):
        problem = "a path without an image file extension"
    elif not os.path.isdir(parent):
        problem = f"a file in a directory that does not exist ({parent})"
    else:
        return
    raise UserError(f"Invalid value for `--{name}`. Received: {path!r}, {problem}. Expected a file path ending in "
                    f"{' or '.join(suffixes)} in an existing directory.")


def read_image(path: str):
    """An RGB uint8 array, or a UserError naming the file."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError) as e:
        raise UserError(f"Cannot read image {path}: {type(e).__name__}: {e}. Expected a PNG or JPEG file.") from None


def load_exported_model(model_dir: str):
    """The run's exported Keras model, or a UserError saying what is missing."""
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
    """Class indices ``[H, W]`` at the image's own size."""
    import numpy as np
    import tensorflow as tf

    size = model.input_shape[1]
    x = tf.image.resize(tf.cast(image[None], tf.float32) / 255.0, (size, size), method="bilinear")
    classes = tf.argmax(model(x, training=False), axis=-1, output_type=tf.int32)[0]
    full = tf.image.resize(classes[..., None], image.shape[:2], method="nearest")[..., 0]
    return np.asarray(full, dtype=np.uint8)


def main(argv: list[str]) -> int:
    for name in ("model_dir", "image", "output"):
        if not FLAGS[name].value:
            raise UserError(f"Missing `--{name}`. "
                            "Received: nothing. Expected --model_dir D --image X.png --output Y.png.")
    check_output("output", FLAGS.output)
    if FLAGS.mask_output:
        check_output("mask_output", FLAGS.mask_output)
    from PIL import Image

    from tfdist.visualize import overlay

    image = read_image(FLAGS.image)
    model = load_exported_model(FLAGS.model_dir)
    mask = predict_mask(model, image)
    Image.fromarray(overlay(image, mask)).save(FLAGS.output)
    if FLAGS.mask_output:
        Image.fromarray(mask).save(FLAGS.mask_output)
    print(f"wrote {FLAGS.output}")
    return 0


def entry() -> None:
    """Console-script entry point (``tfdist-predict``)."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
