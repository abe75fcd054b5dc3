"""What a run leaves behind, read back: its log lines, ``metrics.jsonl`` rows, checkpoints and exported model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from helpers.clis import run_python
from helpers.cluster_runs import shared


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank."""
    return [line for line in text.splitlines() if line.strip()][-1]


def tagged(text: str, tag: str) -> dict:
    """The JSON after ``TAG `` on the first line of ``text`` that starts so (a script's printed results)."""
    return json.loads(next(line for line in text.splitlines() if line.startswith(tag + " "))[len(tag) + 1:])


def script_results(name: str, code_or_args, *, timeout: float = 900, tag: str = "RESULTS") -> dict:
    """The ``TAG`` JSON a Python script prints (``run_python(code_or_args)``, which must exit 0), from its one run
    per test session under ``name``."""
    def make():
        result = run_python(code_or_args, timeout=timeout)
        assert result.returncode == 0, result.stderr[-3000:]
        return tagged(result.stdout, tag)

    return shared(name, make)


def rows(path, split: str | None = None) -> list[dict]:
    """The rows of a ``metrics.jsonl`` (``path``, or the one in the run directory ``path``), of ``split`` if given."""
    path = Path(path)
    path = path / "metrics.jsonl" if path.is_dir() else path
    found = [json.loads(line) for line in path.read_text().splitlines()]
    return found if split is None else [row for row in found if row["split"] == split]


def checkpoint_values(path) -> dict:
    """Every tensor saved in the checkpoint at ``path``, by its key."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(path))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()}


def exported_weights(model_dir) -> list[np.ndarray]:
    """The weights of a run's ``export/model.keras``."""
    import keras

    import tfdist.models.unet  # noqa: F401  (registers ReplicaBatchNorm)

    return keras.models.load_model(Path(model_dir) / "export" / "model.keras").get_weights()


def spread(a: dict, b: dict) -> float:
    """The largest relative difference between two histories' figures (same keys)."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    # np.max, not max: a NaN anywhere is the spread (Python's max keeps a NaN only when it comes first)
    return float(np.max([abs(u - v) / max(abs(v), 1e-12) for key in a for u, v in zip(a[key], b[key], strict=True)]))
