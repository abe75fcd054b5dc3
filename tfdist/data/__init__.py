"""Input data: the embedded shapes set, Oxford-IIIT Pet (TFDS), your own folder; one pipeline, loaded on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdist.data.datasets import DATASETS, dataset
from tfdist.data.shapes import generate_shapes

if TYPE_CHECKING:
    from tfdist.data.pipeline import dataset_fn, load_split, make_dataset, num_examples, resize_and_normalise

#: The names of ``tfdist.data.pipeline`` (which imports TensorFlow), loaded when first used.
_PIPELINE = ("dataset_fn", "load_split", "make_dataset", "num_examples", "resize_and_normalise")


def validate_data(data) -> None:
    """Every check that can fail on the user's data, before any model or strategy is built (no TensorFlow).

    shapes' splits must fit the host's memory; oxford_iiit_pet's ``data_dir``, when given, must be one (the
    dataset itself is checked when it is prepared); folder checks every file (pairs, decodability, mask values).
    """
    dataset(data.dataset).validate(data)


def __getattr__(name: str):
    if name in _PIPELINE:
        from tfdist.data import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DATASETS",
    "dataset",
    "dataset_fn",
    "generate_shapes",
    "load_split",
    "make_dataset",
    "num_examples",
    "resize_and_normalise",
    "validate_data",
]
