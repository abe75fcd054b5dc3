"""The folder dataset: DATA_DIR/images + DATA_DIR/masks, checked up front with named files."""

import numpy as np
import pytest
from PIL import Image

from tfdist.segmentation.config import build_config
from tfdist.data import load_split, make_dataset, num_examples, validate_data
from tfdist.data.folder import list_pairs, split_pairs
from tfdist.errors import UserError


def _write_pairs(root, count=6, num_classes=3):
    """``count`` image/mask pairs of different sizes (masks smaller than their images)."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(exist_ok=True)
    for i in range(count):
        pixels = rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"pet_{i}.{'png' if i % 2 else 'jpg'}")
        Image.fromarray(rng.integers(0, num_classes, (10, 12), dtype=np.uint8), mode="L").save(root / "masks" / f"pet_{i}.png")
    return root


def _folder(root, num_classes=3):
    return build_config(
        overrides={"dataset": "folder", "data_dir": str(root), "num_classes": num_classes, "image_size": 16}
    ).data


def test_loads_and_resizes_different_sizes(tmp_path):
    data = _folder(_write_pairs(tmp_path))
    validate_data(data)
    train = list(load_split(data, "train", seed=0))
    evaluation = list(make_dataset(data, "eval", global_batch_size=4, seed=0, training=False))
    assert len(train) == 5 and sum(int(images.shape[0]) for images, _ in evaluation) == 1
    assert (num_examples(data, "train"), num_examples(data, "eval")) == (5, 1)
    for image, mask in train:
        assert image.shape == (16, 16, 3) and image.dtype.name == "float32"
        assert mask.shape == (16, 16, 1) and mask.dtype.name == "int32"
        assert int(mask.numpy().max()) < 3


def test_split_is_deterministic_disjoint_and_complete(tmp_path):
    pairs = list_pairs(str(_write_pairs(tmp_path, count=11)))
    train, evaluation = split_pairs(pairs, "train"), split_pairs(pairs, "eval")
    assert [p[0].stem for p in evaluation] == ["pet_3", "pet_8"]  # sorted stems: every 5th to eval
    assert sorted(train + evaluation) == sorted(pairs) and not set(train) & set(evaluation)
    few = pairs[:3]
    assert split_pairs(few, "eval") == few[2:] and split_pairs(few, "train") == few[:2]


def _no_dir(root):
    return root / "missing"


def _no_images_dir(root):
    _write_pairs(root)
    for path in (root / "images").iterdir():
        path.unlink()
    (root / "images").rmdir()
    return root


def _no_masks_dir(root):
    _write_pairs(root)
    for path in (root / "masks").iterdir():
        path.unlink()
    (root / "masks").rmdir()
    return root


def _empty(root):
    (root / "images").mkdir()
    (root / "masks").mkdir()
    return root


def _image_without_mask(root):
    _write_pairs(root)
    (root / "masks" / "pet_2.png").unlink()
    return root


def _mask_without_image(root):
    _write_pairs(root)
    (root / "images" / "pet_1.png").unlink()
    return root


def _corrupt_image(root):
    _write_pairs(root)
    (root / "images" / "pet_3.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    return root


def _truncated_mask(root):
    _write_pairs(root)
    path = root / "masks" / "pet_4.png"
    path.write_bytes(path.read_bytes()[:60])
    return root


def _mask_value_too_large(root):
    _write_pairs(root)
    Image.fromarray(np.full((10, 12), 3, np.uint8), mode="L").save(root / "masks" / "pet_5.png")
    return root


def _rgb_mask(root):
    _write_pairs(root)
    Image.fromarray(np.zeros((10, 12, 3), np.uint8)).save(root / "masks" / "pet_0.png")
    return root


def _palette_mask(root):
    _write_pairs(root)
    Image.fromarray(np.zeros((10, 12), np.uint8), mode="L").convert("P").save(root / "masks" / "pet_1.png")
    return root


def _same_stem_twice(root):
    _write_pairs(root)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "images" / "pet_0.png")
    return root


def _one_pair(root):
    _write_pairs(root, count=1)
    return root


@pytest.mark.parametrize(
    "make, match",
    [
        (_no_dir, r"data_dir=.*missing.*not a directory"),
        (_no_images_dir, r"images, which is not a directory"),
        (_no_masks_dir, r"masks, which is not a directory"),
        (_empty, r"no \.png/\.jpg/\.jpeg files in .*images"),
        (_image_without_mask, r"images without a mask: .*pet_2\.jpg"),
        (_mask_without_image, r"masks without an image: .*masks/pet_1\.png"),
        (_corrupt_image, r"Cannot read image .*pet_3\.png"),
        (_truncated_mask, r"Cannot read mask .*pet_4\.png"),
        (_mask_value_too_large, r"Invalid mask .*pet_5\.png\. Received a pixel value 3 with num_classes=3"),
        (_rgb_mask, r"Invalid mask .*pet_0\.png\. Received a PNG image of mode RGB"),
        (_palette_mask, r"Invalid mask .*pet_1\.png\. Received a PNG image of mode P"),
        (_same_stem_twice, r"images that share a name: .*pet_0\.jpg, .*pet_0\.png"),
        (_one_pair, r"Received: 1 image in"),
    ],
)
def test_bad_folders_name_the_problem(tmp_path, make, match):
    data = _folder(make(tmp_path))
    with pytest.raises(UserError, match=match) as info:
        validate_data(data)
    assert "\n" not in str(info.value)
