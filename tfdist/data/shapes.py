"""The embedded default dataset: circles, rectangles and triangles, drawn in numpy from a seed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tfdist.errors import UserError

if TYPE_CHECKING:
    import tensorflow as tf


NUM_CLASSES = 4
BACKGROUND, CIRCLE, RECTANGLE, TRIANGLE = 0, 1, 2, 3
MAX_SHAPES = 3
#: Split name -> the number mixed into the seed, so train and eval never coincide.
SPLIT_SEED_KEYS = {"train": 0, "eval": 1}

_CHUNK = 256  # images rendered at once; bounds the [chunk, H, W] float temporaries
_DARK, _LIGHT = (0.0, 100.0), (155.0, 255.0)  # colour bands (per channel)
_TEXTURE_AMPLITUDE = 18.0
_NOISE_STD = 8.0
_TRIANGLE_SCALE = 1.6  # circumradius / size, so triangles cover about as much as circles


def _draw_params(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """All per-image random choices, drawn up front (small arrays, independent of size)."""
    dark = rng.random(n) < 0.5  # dark background, light shapes (else the reverse)
    bg_low = np.where(dark, _DARK[0], _LIGHT[0])[:, None, None]
    fg_low = np.where(dark, _LIGHT[0], _DARK[0])[:, None, None]
    band = _DARK[1] - _DARK[0]
    return {
        "corners": bg_low + band * rng.random((n, 4, 3)),  # gradient colours at the 4 corners
        "texture": rng.uniform(-1.0, 1.0, (n, 2, 4)),  # 2 waves: fx, fy, phase, amplitude
        "count": rng.integers(1, MAX_SHAPES + 1, n),
        "kind": rng.integers(CIRCLE, TRIANGLE + 1, (n, MAX_SHAPES)),
        "center": rng.uniform(0.22, 0.78, (n, MAX_SHAPES, 2)),  # (x, y) in [0, 1]
        "size": rng.uniform(0.13, 0.26, (n, MAX_SHAPES, 2)),  # radius or half-sides
        "angle": rng.uniform(0.0, 2 * np.pi, (n, MAX_SHAPES)),
        "jitter": rng.uniform(-0.35, 0.35, (n, MAX_SHAPES, 3)),  # triangle vertex angles
        "color": fg_low + band * rng.random((n, MAX_SHAPES, 3)),
    }


def _column(values: np.ndarray) -> np.ndarray:
    """Per-image values ``[n]`` as ``[n, 1, 1]``, to broadcast against the pixel grid."""
    return values.astype(np.float32)[:, None, None]


def _background(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bilinear gradient between random corner colours plus low-frequency waves: [n, H, W, 3].

    Both parts are separable in x and y, so they are built from rows and columns
    and only one full-size array is ever written per step.
    """
    c = p["corners"].astype(np.float32)[:, None, None]  # [n, 1, 1, 4, 3]
    xs, ys = x[..., None], y[..., None]
    top = c[..., 0, :] + (c[..., 1, :] - c[..., 0, :]) * xs  # [n, 1, W, 3]
    bottom = c[..., 2, :] + (c[..., 3, :] - c[..., 2, :]) * xs
    image = top + (bottom - top) * ys  # [n, H, W, 3]
    t = p["texture"]
    for k in range(t.shape[1]):
        fx, fy, phase, amp = (_column(t[:, k, j]) for j in range(4))
        u = 2 * np.pi * 2.5 * fx * x + np.pi * phase  # [n, 1, W]
        v = 2 * np.pi * 2.5 * fy * y  # [n, H, 1]
        scale = _TEXTURE_AMPLITUDE * (0.5 + 0.5 * amp)
        wave = (scale * np.sin(u)) * np.cos(v) + (scale * np.cos(u)) * np.sin(v)  # sin(u + v)
        image += wave[..., None]
    return image


def _triangle(p: dict[str, np.ndarray], s: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Inside test for an irregular triangle around the shape's centre: [n, H, W] bool.

    A point is inside when its three edge functions ``a*x + b*y + c`` share a sign.
    """
    radius = _TRIANGLE_SCALE * p["size"][:, s, 0:1]
    angles = p["angle"][:, s, None] + 2 * np.pi * np.arange(3) / 3 + p["jitter"][:, s]
    vx = p["center"][:, s, 0:1] + radius * np.cos(angles)  # [n, 3]
    vy = p["center"][:, s, 1:2] + radius * np.sin(angles)
    dx, dy = np.roll(vx, -1, axis=1) - vx, np.roll(vy, -1, axis=1) - vy
    positive = negative = True
    for j in range(3):
        edge = _column(dy[:, j]) * x + (_column(-dx[:, j]) * y + _column(vy[:, j] * dx[:, j] - vx[:, j] * dy[:, j]))
        positive, negative = positive & (edge >= 0), negative & (edge <= 0)
    return positive | negative


def _shape_mask(p: dict[str, np.ndarray], s: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pixels covered by shape slot ``s`` of every image (empty when the image has fewer)."""
    cx, cy = (_column(p["center"][:, s, j]) for j in range(2))
    sx, sy = (_column(p["size"][:, s, j]) for j in range(2))
    kind = p["kind"][:, s][:, None, None]
    circle = (x - cx) ** 2 + (y - cy) ** 2 <= sx**2
    rectangle = (np.abs(x - cx) <= sx) & (np.abs(y - cy) <= sy)
    inside = np.where(kind == CIRCLE, circle, np.where(kind == RECTANGLE, rectangle, _triangle(p, s, x, y)))
    return inside & (s < p["count"])[:, None, None]


def _render(p: dict[str, np.ndarray], size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw one chunk of images and masks from its parameters."""
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size
    x, y = coords[None, None, :], coords[None, :, None]  # [1, 1, W] and [1, H, 1]
    image = _background(p, x, y)
    top = np.full(image.shape[:3], -1, np.int8)  # index of the topmost shape at each pixel
    for s in range(MAX_SHAPES):  # later shapes on top
        top[_shape_mask(p, s, x, y)] = s
    covered = top >= 0
    rows = np.arange(len(top))[:, None, None]
    slot = np.maximum(top, 0)
    mask = np.where(covered, p["kind"][rows, slot], BACKGROUND).astype(np.uint8)
    image = np.where(covered[..., None], p["color"].astype(np.float32)[rows, slot], image)
    image += rng.standard_normal(image.shape, dtype=np.float32) * np.float32(_NOISE_STD)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), mask[..., None]


def generate_shapes(num_examples: int, image_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``num_examples`` images ``uint8 [N, S, S, 3]`` and class masks ``uint8 [N, S, S, 1]``.

    The same ``(num_examples, image_size, seed)`` always gives the same arrays.
    """
    rng = np.random.default_rng(seed)
    params = _draw_params(rng, num_examples)
    images = np.empty((num_examples, image_size, image_size, 3), np.uint8)
    masks = np.empty((num_examples, image_size, image_size, 1), np.uint8)
    for start in range(0, num_examples, _CHUNK):
        part = {k: v[start : start + _CHUNK] for k, v in params.items()}
        stop = start + len(part["count"])
        images[start:stop], masks[start:stop] = _render(part, image_size, rng)
    return images, masks


def check_split_sizes(data) -> None:
    """Refuse a split that could not be generated in this host's memory, before anything is written.

    Each split is generated whole (``generate_shapes``: one byte per channel of every pixel, image and mask);
    a ``train_examples`` far past the host's memory would fail only once the run has started.
    """
    import os

    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows): nothing to compare with
        return
    for name in ("train_examples", "eval_examples"):
        count = getattr(data, name)
        size = count * data.image_size * data.image_size * 4
        if size > memory:
            raise UserError(
                f"Invalid value for `--{name}`: its shapes split would take {size / 2**30:.1f} GiB, more than this "
                f"host's {memory / 2**30:.1f} GiB of memory. Received: {name}={count}, image_size={data.image_size}. "
                f"Expected at most {memory // (data.image_size * data.image_size * 4)} examples at this image_size."
            )


def split_seed(seed: int, split: str) -> int:
    """The generator seed of ``split``, derived from the run's seed (train and eval differ)."""
    return int(np.random.SeedSequence([seed, SPLIT_SEED_KEYS[split]]).generate_state(1)[0])


def shapes_split(data, split: str, seed: int) -> tf.data.Dataset:
    """The ``train`` or ``eval`` split as a ``tf.data.Dataset`` of unbatched ``(image, mask)``.

    Sizes come from ``data.train_examples`` / ``data.eval_examples``; images are
    generated at ``data.image_size``, so the pipeline's resize is a no-op here.
    """
    import tensorflow as tf

    count = data.train_examples if split == "train" else data.eval_examples
    images, masks = generate_shapes(count, data.image_size, split_seed(seed, split))
    return tf.data.Dataset.from_tensor_slices((images, masks))
