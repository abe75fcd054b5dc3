"""Oxford-IIIT Pet through TensorFlow Datasets, with one preparer per machine."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import TYPE_CHECKING

from tfdist.errors import UserError

if TYPE_CHECKING:
    import tensorflow as tf


NAME = "oxford_iiit_pet"
NUM_CLASSES = 3
#: tfdist split -> TFDS split.
TFDS_SPLITS = {"train": "train", "eval": "test"}
TRIMAP_PET, TRIMAP_BORDER = 1, 3


def data_root(data) -> Path:
    """The TFDS data directory: ``data.data_dir``, else TFDS's default (``TFDS_DATA_DIR`` or ~/tensorflow_datasets)."""
    if data.data_dir:
        return Path(data.data_dir).expanduser()
    from tensorflow_datasets.core import constants

    return Path(constants.get_default_data_dir()).expanduser()


def lock_path(root: Path) -> Path:
    """The file whose exclusive lock marks the one process that prepares the dataset."""
    return root / f"{NAME}.prepare.lock"


def _prepare_failed(builder, root: Path, error: Exception) -> UserError:
    """The one-line message for a dataset that could not be downloaded or prepared."""
    reason = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    where = getattr(builder, "data_dir", root)
    return UserError(
        f"Cannot download or prepare the TFDS dataset {NAME} in {root}. Received: {reason}. "
        f"Expected the prepared dataset at {where} (build it where there is network with "
        f"`tfds build {NAME} --data_dir=DIR` and copy DIR here, then pass --data_dir=DIR), "
        "or network access to download it, or --dataset=shapes or --dataset=folder."
    )


def prepare(builder, root: Path) -> None:
    """Run ``builder.download_and_prepare()`` under an exclusive lock in ``root``.

    The first process to get the lock prepares; the others block on it and
    then call ``download_and_prepare`` again, which finds the data ready. A
    read-only ``root`` (data prepared elsewhere and mounted) cannot hold the
    lock file, and needs no lock: nothing will be written there.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path(root), "a")
    except OSError:
        handle = None
    try:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        builder.download_and_prepare()
    except UserError:
        raise
    except Exception as e:  # TFDS raises many kinds (network, missing extras, disk)
        raise _prepare_failed(builder, root, e) from None
    finally:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def trimap_to_classes(trimap: tf.Tensor) -> tf.Tensor:
    """Trimap values 1, 2, 3 -> classes 0, 1, 2; values outside are clipped in first."""
    import tensorflow as tf

    trimap = tf.clip_by_value(tf.cast(trimap, tf.int32), TRIMAP_PET, TRIMAP_BORDER)
    return tf.cast(trimap - TRIMAP_PET, tf.uint8)


def _pair(example):
    """A TFDS example -> ``(uint8 image [H, W, 3], uint8 class mask [h, w, 1])``."""
    return example["image"], trimap_to_classes(example["segmentation_mask"])


def pet_split(data, split: str) -> tf.data.Dataset:
    """The ``train`` or ``eval`` split as unbatched raw ``(image, mask)``, prepared first if needed."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    root = data_root(data)
    try:
        builder = tfds.builder(NAME, data_dir=str(root))
    except Exception as e:
        raise _prepare_failed(None, root, e) from None
    prepare(builder, root)
    ds = builder.as_dataset(split=TFDS_SPLITS[split], shuffle_files=False)
    return ds.map(_pair, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
