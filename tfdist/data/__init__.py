"""Input data: the embedded shapes set, Oxford-IIIT Pet (TFDS), your own folder; one pipeline.

``load_split`` gives the unbatched examples of a split, ``make_dataset`` the
batches of one input pipeline, ``dataset_fn`` the same as a function of the
distribution strategy's input context, and ``validate_data`` checks the user's
data before anything is built; ``num_examples`` sizes an epoch.
"""

from tfdist.data.pipeline import (
    dataset_fn,
    load_split,
    make_dataset,
    num_examples,
    resize_and_normalise,
    validate_data,
)
from tfdist.data.shapes import generate_shapes

__all__ = [
    "dataset_fn",
    "generate_shapes",
    "load_split",
    "make_dataset",
    "num_examples",
    "resize_and_normalise",
    "validate_data",
]
