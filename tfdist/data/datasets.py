"""The datasets ``tfdist.train`` reads, one row each: its classes, its checks (before TensorFlow starts), its
raw split, and how many examples a split holds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from tfdist.config import check_choice
from tfdist.errors import UserError, check_directory


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One dataset ``--dataset`` names.

    Attributes:
      name: the name ``--dataset`` takes.
      num_classes: its classes when ``--num_classes`` is left at 0 (0: the flag is required).
      check_classes: ``(data, num_classes) -> None``: refuses a configuration the dataset cannot have (no I/O).
      validate: ``data -> None``: checks that read the data or the host, before any model is built (no
        TensorFlow).
      split: ``(data, split, seed) -> tf.data.Dataset`` of raw unbatched ``(uint8 image, uint8 mask)``.
      examples: ``(data, split) -> int`` when the configuration says it; None: counted from ``split``.
      data_dir: what ``--data_dir`` must name when the dataset needs one ("": it does not).
    """

    name: str
    num_classes: int
    check_classes: Callable[..., None]
    validate: Callable[..., None]
    split: Callable
    examples: Callable[..., int] | None = None
    data_dir: str = ""


def _shapes() -> Dataset:
    from tfdist.data import shapes

    def check_classes(data, num_classes: int) -> None:
        if num_classes < shapes.NUM_CLASSES:
            raise UserError(f"Invalid value for `--num_classes` for shapes. Received: num_classes={num_classes}. "
                            f"Expected at least {shapes.NUM_CLASSES} (background and three shapes), or no "
                            "--num_classes.")

    return Dataset(name="shapes", num_classes=shapes.NUM_CLASSES, check_classes=check_classes,
                   validate=shapes.check_split_sizes, split=shapes.shapes_split,
                   examples=lambda data, split: data.train_examples if split == "train" else data.eval_examples)


def _oxford_iiit_pet() -> Dataset:
    from tfdist.data import oxford_iiit_pet as pet

    def check_classes(data, num_classes: int) -> None:
        if num_classes != pet.NUM_CLASSES:
            raise UserError(f"Invalid value for `--num_classes` for {pet.NAME}. Received: num_classes={num_classes}. "
                            f"Expected {pet.NUM_CLASSES} (pet, background, border).")

    def validate(data) -> None:
        if data.data_dir:  # TFDS's directory: it may not exist yet, and cannot be a file
            check_directory(Path(data.data_dir).expanduser(), "--data_dir",
                            f"Expected the TFDS data directory of {pet.NAME} (existing or new).", writable=False)

    return Dataset(name=pet.NAME, num_classes=pet.NUM_CLASSES, check_classes=check_classes, validate=validate,
                   split=lambda data, split, seed: pet.pet_split(data, split))


def _folder() -> Dataset:
    from tfdist.data import folder

    return Dataset(name="folder", num_classes=0, check_classes=lambda data, num_classes: None,  # masks checked
                   validate=folder.check_folder, split=lambda data, split, seed: folder.folder_split(data, split),
                   data_dir="a directory with images/ and masks/")


#: Every dataset, by name, in the order ``--dataset``'s help lists them.
DATASETS: dict[str, Dataset] = {row.name: row for row in (_shapes(), _oxford_iiit_pet(), _folder())}


def dataset(name: str) -> Dataset:
    """The row of ``name``.

    Raises:
      UserError: no dataset has that name.
    """
    check_choice("dataset", name, tuple(DATASETS))
    return DATASETS[name]
