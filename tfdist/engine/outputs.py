"""What a run leaves in ``model_dir`` (params, metrics, summary, TensorBoard, export), written by the chief alone."""

from __future__ import annotations

import json
import math

import numpy as np
import tensorflow as tf

from tfdist import config as config_lib
from tfdist.rundir import RunDir


def _finite(value):
    """JSON has no NaN: write non-finite floats as null, in nested dicts and lists too (a numpy array, a metric
    with one value per class, as a list)."""
    if isinstance(value, np.ndarray):
        return _finite(value.tolist())
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunOutputs:
    """The chief's writer for one run directory.

    Args:
      run_dir: the run's directory.
      is_chief: only the chief writes; elsewhere every call does nothing.
      evaluator: rows go to the evaluator side-car's own file
        (``RunDir.evaluator_metrics``) instead of ``metrics.jsonl``.
    """

    def __init__(self, *, run_dir: RunDir, is_chief: bool, evaluator: bool = False):
        self.run_dir = run_dir
        self.is_chief = is_chief
        self.metrics_file = run_dir.evaluator_metrics if evaluator else run_dir.metrics
        self._writers = {}
        if is_chief:
            run_dir.path.mkdir(parents=True, exist_ok=True)

    def _writer(self, split: str):
        if split not in self._writers:
            self._writers[split] = tf.summary.create_file_writer(str(self.run_dir.tensorboard(split)))
        return self._writers[split]

    def write_params(self, config) -> None:
        if self.is_chief:
            self.run_dir.params.write_text(config_lib.to_yaml(config))

    def log(self, split: str, step: int, values: dict) -> None:
        """Append one row to metrics.jsonl and write its scalars to TensorBoard."""
        if not self.is_chief:
            return
        row = {"step": int(step), "split": split, **{k: _finite(v) for k, v in values.items()}}
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(row) + "\n")
        with self._writer(split).as_default(step=int(step)):
            for name, value in values.items():
                if isinstance(value, (int, float)) and name != "images":
                    tf.summary.scalar(name, value)

    def log_images(self, split: str, step: int, name: str, images) -> None:
        """A batch of images (``[n, height, width, channels]``) in TensorBoard's ``split``, as ``name``."""
        if not self.is_chief:
            return
        with self._writer(split).as_default(step=int(step)):
            tf.summary.image(name, images, max_outputs=len(images))

    def write_summary(self, summary: dict) -> None:
        if self.is_chief:
            text = json.dumps(_finite(summary), indent=2)
            self.run_dir.summary.write_text(text + "\n")

    def export(self, model) -> None:
        """``export/model.keras`` and ``export/saved_model`` (serving signature) from a plain copy."""
        if not self.is_chief:
            return
        self.run_dir.export.mkdir(parents=True, exist_ok=True)
        model.save(self.run_dir.exported_model)
        model.export(str(self.run_dir.saved_model), format="tf_saved_model", verbose=False)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.flush()
            writer.close()
        self._writers = {}
