"""Your own images and masks from a directory, paired by stem and checked file by file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tfdist.errors import UserError

if TYPE_CHECKING:
    import tensorflow as tf


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MASK_SUFFIX = ".png"
EVAL_EVERY = 5
_MAX_NAMED = 5  # files named in one message before "and N more"


def _names(paths) -> str:
    """A short, readable list of files for a one-line message."""
    paths = sorted(str(p) for p in paths)
    more = f" and {len(paths) - _MAX_NAMED} more" if len(paths) > _MAX_NAMED else ""
    return ", ".join(paths[:_MAX_NAMED]) + more


def _files(directory: Path, suffixes: tuple[str, ...], what: str) -> dict[str, Path]:
    """Stem -> file for the files of ``directory`` with one of ``suffixes`` (any case)."""
    if not directory.is_dir():
        raise UserError(
            f"Invalid folder dataset. Received: {directory}, which is not a directory. "
            f"Expected {what} in {directory}/ (layout: DATA_DIR/images/*.png|jpg|jpeg, DATA_DIR/masks/*.png)."
        )
    by_stem: dict[str, list[Path]] = {}
    for path in directory.iterdir():
        if path.is_file() and path.suffix.lower() in suffixes:
            by_stem.setdefault(path.stem, []).append(path)
    clashes = [p for group in by_stem.values() if len(group) > 1 for p in group]
    if clashes:
        raise UserError(
            f"Invalid folder dataset. Received {what} that share a name: {_names(clashes)}. "
            "Expected one file per name, so that each image has exactly one mask."
        )
    return {stem: group[0] for stem, group in by_stem.items()}


def list_pairs(data_dir: str) -> list[tuple[Path, Path]]:
    """The ``(image, mask)`` pairs of ``data_dir``, sorted by stem; structure checked, contents not."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise UserError(
            f"Invalid value for `--data_dir`. Received: data_dir={data_dir!r}, which is not a directory. "
            "Expected a directory with images/ and masks/."
        )
    images = _files(root / "images", IMAGE_SUFFIXES, "images")
    masks = _files(root / "masks", (MASK_SUFFIX,), "masks")
    if not images:
        raise UserError(
            f"Invalid folder dataset. Received: no .png/.jpg/.jpeg files in {root / 'images'}. "
            "Expected at least 2 images with masks."
        )
    lonely_images = [images[s] for s in images.keys() - masks.keys()]
    if lonely_images:
        raise UserError(
            f"Invalid folder dataset. Received images without a mask: {_names(lonely_images)}. "
            f"Expected a mask of the same name in {root / 'masks'}."
        )
    lonely_masks = [masks[s] for s in masks.keys() - images.keys()]
    if lonely_masks:
        raise UserError(
            f"Invalid folder dataset. Received masks without an image: {_names(lonely_masks)}. "
            f"Expected an image of the same name in {root / 'images'}."
        )
    if len(images) < 2:
        raise UserError(
            f"Invalid folder dataset. Received: 1 image in {root / 'images'}. "
            "Expected at least 2 (one for train, one for eval)."
        )
    return [(images[s], masks[s]) for s in sorted(images)]


def split_pairs(pairs: list, split: str) -> list:
    """Every ``EVAL_EVERY``-th pair to eval (the last one if there are fewer), the rest to train."""
    eval_positions = set(range(EVAL_EVERY - 1, len(pairs), EVAL_EVERY)) or {len(pairs) - 1}
    return [p for i, p in enumerate(pairs) if (i in eval_positions) == (split == "eval")]


def _open(path: Path, kind: str):
    """Decode ``path`` fully with PIL (so truncated files fail here, not mid-training)."""
    from PIL import Image

    try:
        image = Image.open(path)
        image.load()
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError... for bad files
        raise UserError(
            f"Cannot read {kind} {path}. Received: {type(e).__name__}: {e}. Expected a valid "
            f"{'PNG or JPEG' if kind == 'image' else 'PNG'} file."
        ) from None
    return image


def _check_image(path: Path) -> None:
    """An image must decode and be a PNG or JPEG (TensorFlow decodes it again later)."""
    with _open(path, "image") as image:
        if image.format not in ("PNG", "JPEG"):
            raise UserError(f"Invalid image {path}. Received a {image.format} file. Expected a PNG or JPEG file.")


def _check_mask(path: Path, num_classes: int) -> None:
    """A mask must be an 8-bit greyscale PNG whose values are all < ``num_classes``."""
    with _open(path, "mask") as mask:
        if mask.format != "PNG" or mask.mode != "L":
            raise UserError(
                f"Invalid mask {path}. Received a {mask.format} image of mode {mask.mode}. Expected an 8-bit "
                "single-channel (mode L) PNG whose pixels are class indices; convert a palette mask with "
                "PIL.Image.fromarray(numpy.asarray(Image.open(path))).save(path)."
            )
        largest = int(np.asarray(mask).max())
    if largest >= num_classes:
        raise UserError(
            f"Invalid mask {path}. Received a pixel value {largest} with num_classes={num_classes}. "
            f"Expected class indices 0..{num_classes - 1} (or a larger --num_classes)."
        )


def check_folder(data) -> list[tuple[Path, Path]]:
    """All the up-front checks: layout, pairing, every file decodable, mask values in range."""
    pairs = list_pairs(data.data_dir)
    for image, mask in pairs:
        _check_image(image)
        _check_mask(mask, data.num_classes)
    return pairs


def _read(image_path, mask_path):
    """File names -> raw ``(uint8 image [H, W, 3], uint8 mask [h, w, 1])``."""
    import tensorflow as tf

    image = tf.io.decode_image(tf.io.read_file(image_path), channels=3, expand_animations=False)
    mask = tf.io.decode_png(tf.io.read_file(mask_path), channels=1)
    return image, mask


def folder_split(data, split: str) -> tf.data.Dataset:
    """The ``train`` or ``eval`` split as a ``tf.data.Dataset`` of unbatched raw ``(image, mask)``."""
    import tensorflow as tf

    pairs = split_pairs(list_pairs(data.data_dir), split)
    images = [str(image) for image, _ in pairs]
    masks = [str(mask) for _, mask in pairs]
    ds = tf.data.Dataset.from_tensor_slices((images, masks))
    return ds.map(_read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
