"""A run directory (``--model_dir``): every path a run leaves, in one place, and whether a new run may resume it."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import yaml

from tfdist.cluster.task import slug_of
from tfdist.errors import UserError, file_in_the_way, unwritable_directory

#: Settings that must not change between a run and its resumption.
RESUME_KEYS = {
    # The checkpoint's optimizer slots and loss-scale variables are those of its optimizer and precision.
    "runtime": ("precision",),
    "data": ("dataset", "image_size", "num_classes"),
    # Every field of the model section: the checkpoint's variables are those of its model.
    "model": ("encoder", "base_filters", "depth", "batch_norm", "norm", "dropout", "encoder_weights"),
    # The data position of a resumed run is its step times the global batch (segmentation.inputs,
    # fitting.inputs), and the learning-rate schedule is in steps: with another global batch both would be wrong.
    # ... and its moving averages (--ema_momentum) are optimizer variables too.
    "train": ("global_batch_size", "optimizer", "ema_momentum"),
}


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The layout of one run directory.

    Attributes:
        path: the directory (``--model_dir``); nothing is created by making a ``RunDir``.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def params(self) -> Path:
        return self.path / "params.yaml"

    @property
    def fit_record(self) -> Path:
        """``fit.yaml``: what a ``tfdist.fit`` run that must not change on resume was given (its ``batch_size``)."""
        return self.path / "fit.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def evaluator_metrics(self) -> Path:
        return self.path / "evaluator.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def heartbeats(self) -> Path:
        """``heartbeats/``: each task's ``<type>-<index>.json`` while it runs (``runtime.watchdog``)."""
        return self.path / "heartbeats"

    @property
    def fit_inputs(self) -> Path:
        """``fit-inputs/``: ``tfdist.fit``'s numpy or Dataset input, saved for a coordinator's workers to load."""
        return self.path / "fit-inputs"

    def tensorboard(self, split: str) -> Path:
        """The TensorBoard log directory of ``split`` (``train``, ``eval``, ``evaluator``)."""
        return self.path / "tensorboard" / split

    @property
    def export(self) -> Path:
        return self.path / "export"

    @property
    def exported_model(self) -> Path:
        """``export/model.keras``: what ``tfdist.predict`` loads."""
        return self.export / "model.keras"

    @property
    def saved_model(self) -> Path:
        """``export/saved_model``: a SavedModel with a serving signature."""
        return self.export / "saved_model"

    def latest_checkpoint(self) -> str | None:
        """The path of the chief's latest checkpoint, or None."""
        import tensorflow as tf

        return tf.train.latest_checkpoint(str(self.checkpoints))

    def scratch(self, task: str) -> Path:
        """A fresh temporary directory for ``task``'s checkpoints (``"worker:1"``), emptied if it exists."""
        digest = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"tfdist-worker-ckpt-{digest}-{slug_of(task)}"
        shutil.rmtree(path, ignore_errors=True)  # what a killed run of this task left
        path.mkdir(parents=True)
        return path

    def check_place(self, name: str = "--model_dir") -> None:
        """Refuse a path that cannot hold a run directory, before anything is written.

        ``name`` is how the caller's user gave the path (``--model_dir``, or ``model_dir`` of ``tfdist.fit``).

        Raises:
            UserError: the path is a file, lies under a file or in a directory this process cannot write, or
                its ``params.yaml`` is not a file.
        """
        expected = "Expected a directory (an existing run's, or a new one)."
        blocking = file_in_the_way(self.path)
        if blocking == self.path:
            raise UserError(f"Invalid `{name}`: not a directory. "
                            f"Received: {str(self.path)!r}, an existing file. {expected}")
        if blocking is not None:
            raise UserError(f"Invalid `{name}`: {blocking} is a file. Received: {str(self.path)!r}. {expected}")
        locked = unwritable_directory(self.path)
        if locked is not None:
            raise UserError(f"Invalid `{name}`: {locked} is not writable. Received: {str(self.path)!r}. Expected a "
                            "directory this process can write (an existing run's, or a new one).")
        if self.params.exists() and not self.params.is_file():
            raise UserError(f"Invalid `{name}`: its {self.params.name} is not a file. Received: {str(self.path)!r}. "
                            f"{expected}")

    def _old_params(self) -> dict:
        """The ``params.yaml`` of the run there (``{}`` without one), as sections of settings."""
        if not self.params.is_file():
            return {}
        expected = "Expected the params.yaml of an earlier tfdist run, or a new --model_dir."
        try:
            old = yaml.safe_load(self.params.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as e:
            raise UserError(f"Cannot read {self.params}: it is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} "
                            f"at offset {e.start}). {expected}") from None
        except (OSError, yaml.YAMLError) as e:
            raise UserError(f"Cannot read {self.params}: {' '.join(str(e).split())}. {expected}") from None
        sections = old.values() if isinstance(old, dict) else ()
        if not isinstance(old, dict) or not all(s is None or isinstance(s, dict) for s in sections):
            raise UserError(f"Invalid {self.params}: not a mapping of sections. "
                            f"Received: {str(old)[:60]!r}. {expected}")
        return old

    def check_resume(self, params: Mapping[str, Mapping[str, Any]]) -> None:
        """Refuse a run directory that cannot be one (``check_place``), or whose model or data differ from ``params``.

        Args:
            params: the new run's resolved config as nested dicts (the shape of ``params.yaml``).

        Raises:
            UserError: the path cannot be a run directory; ``params.yaml`` cannot be
                read, or holds another value of a setting that must not change (``RESUME_KEYS``).
        """
        model_dir = params["train"]["model_dir"]
        self.check_place()
        self._check_written_by("tfdist.train", model_dir, "--model_dir")
        old = self._old_params()
        new = params
        for section, keys in RESUME_KEYS.items():
            for key in keys:
                before = (old.get(section) or {}).get(key)
                if before is not None and before != new[section][key]:
                    raise UserError(
                        f"Invalid --model_dir {model_dir}: "
                        f"it holds a run with {section}.{key}={before!r}. Received: {key}={new[section][key]!r}. "
                        "Expected the same value to resume, or a new --model_dir."
                    )

    def _check_written_by(self, client: str, received, name: str) -> None:
        """Refuse a run directory that the other client wrote: ``tfdist.fit``'s (``fit.yaml``, or checkpoints with
        no ``params.yaml``) for ``tfdist.train``, ``tfdist.train``'s (``params.yaml``) for ``tfdist.fit``."""
        if client == "tfdist.train":
            has_checkpoints = self.checkpoints.is_dir() and any(self.checkpoints.iterdir())
            other = self.fit_record.exists() or (has_checkpoints and not self.params.exists())
        else:
            other = self.params.exists()
        if other:
            writer = "tfdist.fit" if client == "tfdist.train" else "tfdist.train"
            raise UserError(f"Invalid {name} {received}: it holds a {writer} run, which {client} cannot resume. "
                            f"Received: {name}={str(received)!r} for {client}. Expected a {client} run's directory, "
                            "or a new one.")

    def check_fit_resume(self, batch_size, name: str = "model_dir") -> None:
        """Refuse to resume in ``tfdist.fit`` a run that ``tfdist.train`` wrote, or one fitted with another batch.

        Raises:
            UserError: ``params.yaml`` is there, or ``fit.yaml`` holds another ``batch_size``.
        """
        self._check_written_by("tfdist.fit", self.path, name)
        if not self.fit_record.is_file():
            return
        try:
            before = (yaml.safe_load(self.fit_record.read_text(encoding="utf-8")) or {}).get("batch_size")
        except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError) as e:
            raise UserError(f"Cannot read {self.fit_record}: {type(e).__name__}. Expected the fit.yaml of an earlier "
                            f"tfdist.fit run, or a new {name}.") from None
        if before != batch_size:
            raise UserError(f"Invalid {name} {self.path}: it holds a tfdist.fit run with batch_size={before!r}. "
                            f"Received: batch_size={batch_size!r}. Expected the same batch_size to resume (its epochs "
                            f"and data position are counted in its batches), or a new {name}.")

    def write_fit_record(self, batch_size) -> None:
        """Record ``tfdist.fit``'s ``batch_size`` for its resumptions (``check_fit_resume``); once, at the start."""
        if not self.fit_record.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            self.fit_record.write_text(yaml.safe_dump({"client": "tfdist.fit", "batch_size": batch_size}))
