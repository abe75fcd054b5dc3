"""Input data: the embedded shapes set, Oxford-IIIT Pet (TFDS), your own folder; one pipeline, loaded on first use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tfdist.data.shapes import check_split_sizes, generate_shapes
from tfdist.errors import check_directory

if TYPE_CHECKING:
    from tfdist.data.pipeline import dataset_fn, load_split, make_dataset, num_examples, resize_and_normalise

#: The names of ``tfdist.data.pipeline`` (which imports TensorFlow), loaded when first used.
_PIPELINE = ("dataset_fn", "load_split", "make_dataset", "num_examples", "resize_and_normalise")


def validate_data(data) -> None:
    """Every check that can fail on the user's data, before any model or strategy is built (no TensorFlow).

    shapes' splits must fit the host's memory; oxford_iiit_pet is checked when it is
    prepared; folder checks every file (pairs, decodability, mask values).
    """
    if data.dataset == "shapes":
        check_split_sizes(data)
    elif data.dataset == "folder":
        from tfdist.data.folder import check_folder

        check_folder(data)
    elif data.dataset == "oxford_iiit_pet" and data.data_dir:  # TFDS's directory: may not exist yet, cannot be a file
        check_directory(Path(data.data_dir).expanduser(), "--data_dir",
                        f"Expected the TFDS data directory of {data.dataset} (existing or new).", writable=False)


def __getattr__(name: str):
    if name in _PIPELINE:
        from tfdist.data import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "dataset_fn",
    "generate_shapes",
    "load_split",
    "make_dataset",
    "num_examples",
    "resize_and_normalise",
    "validate_data",
]
