"""A run directory (``--model_dir``): every path a run leaves, in one place, and whether a new run may resume it
(``damage``: whether the files a run left are whole)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import yaml

from tfdist.cluster.task import slug_of
from tfdist.errors import UserError, article, check_directory, resolve_dots
from tfdist.rundir import damage

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

#: What ``fit.yaml`` records of a ``tfdist.fit`` run that must not change on resume: the data position and epochs
#: are counted in its batches, and the optimizer's moving averages and gradient accumulators are variables of
#: its checkpoint, as ``RESUME_KEYS``' ``ema_momentum`` is for ``tfdist.train``.
FIT_RESUME_KEYS = ("batch_size", "ema_momentum", "gradient_accumulation_steps")

#: The TensorBoard logs a run writes, one directory each (``RunDir.tensorboard``).
TENSORBOARD_SPLITS = ("train", "eval", "evaluator")


def refuse_changed(setting: str, before, received, *, name: str, path, run: str = "run", why: str = "") -> None:
    """The one rule of both clients for a setting that must not change on resume: ``before`` (the run's record;
    None: not recorded) must equal ``received``.

    ``run`` says whose run it is (``tfdist.fit run``), ``why`` why the setting must stay (`` (its ...)``).

    Raises:
        UserError: ``before`` is recorded and differs, naming ``setting`` and ``name`` (the run directory's
            argument, ``--model_dir`` or ``model_dir``).
    """
    if before is None or before == received:
        return
    key = setting.rsplit(".", 1)[-1]
    raise UserError(f"Invalid {name} {path}: it holds a {run} with {setting}={before!r}. Received: "
                    f"{key}={received!r}. Expected the same value to resume{why}, or a new {name}.")


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The layout of one run directory.

    Attributes:
        path: the directory (``--model_dir``); nothing is created by making a ``RunDir``.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", resolve_dots(self.path))

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
        """The TensorBoard log directory of ``split`` (one of ``TENSORBOARD_SPLITS``)."""
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
        expected = "Expected a directory this process can write (an existing run's, or a new one)."
        check_directory(self.path, name, expected)
        if os.path.lexists(self.params) and not self.params.is_file():
            raise UserError(f"Invalid value for `{name}`: its {self.params.name} is not a file. "
                            f"Received: {str(self.path)!r}, where it is {article(damage.kind(self.params))}. "
                            f"{expected}")

    def _old_params(self) -> dict:
        """The ``params.yaml`` of the run there (``{}`` without one), as sections of settings."""
        if not self.params.is_file():
            return {}
        expected = "Expected the params.yaml of an earlier tfdist run, or a new --model_dir."
        try:
            old = yaml.safe_load(self.params.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise UserError(f"Cannot read {self.params}: it is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} "
                            f"at offset {e.start}). {expected}") from None
        except (OSError, yaml.YAMLError) as e:
            raise UserError(f"Cannot read {self.params}: {' '.join(str(e).split())}. {expected}") from None
        if old is None:  # what a run leaves is never empty: its checkpoints would be resumed with another config
            raise UserError(f"Invalid --model_dir {self.path}: its params.yaml is empty. Received: an empty file. "
                            "Expected the params.yaml of the run there (restore it, or remove the run directory), "
                            "or a new --model_dir.")
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
            UserError: the path cannot be a run directory, or is a damaged one (``check_intact``); ``params.yaml``
                cannot be read, or holds another value of a setting that must not change (``RESUME_KEYS``).
        """
        model_dir = params["train"]["model_dir"]
        self.check_place()
        self._check_written_by("tfdist.train", model_dir, "--model_dir")
        self.check_intact("--model_dir")
        old = self._old_params()
        damage.check_params_whole(old, params, self.path)
        for section, keys in RESUME_KEYS.items():
            for key in keys:
                refuse_changed(f"{section}.{key}", (old.get(section) or {}).get(key), params[section][key],
                               name="--model_dir", path=model_dir)

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

    def check_fit_resume(self, settings: Mapping[str, Any], name: str = "model_dir") -> None:
        """Refuse to resume in ``tfdist.fit`` a damaged run directory, one that ``tfdist.train`` wrote, or one
        fitted with other ``settings`` (``batch_size``, before TensorFlow starts; the optimizer's, once
        ``model_fn`` has built it, go to ``check_fit_settings``).

        Raises:
            UserError: ``check_intact`` refuses it, ``params.yaml`` is there, or ``fit.yaml`` cannot be read or
                holds another value of one of ``settings``.
        """
        self._check_written_by("tfdist.fit", self.path, name)
        self.check_intact(name)
        self.check_fit_settings(settings, name)

    def check_fit_settings(self, settings: Mapping[str, Any], name: str = "model_dir") -> None:
        """Refuse to resume a ``tfdist.fit`` run with other ``settings`` (of ``FIT_RESUME_KEYS``) than its
        ``fit.yaml`` records; the rest of the directory is ``check_fit_resume``'s.

        Raises:
            UserError: ``fit.yaml`` cannot be read or holds another value of one of ``settings``.
        """
        record = self._fit_record(name)
        why = {"batch_size": " (its epochs and data position are counted in its batches)"}
        for key, value in settings.items():
            refuse_changed(key, record.get(key), value, name=name, path=self.path, run="tfdist.fit run",
                           why=why.get(key, ""))

    def _fit_record(self, name: str) -> dict:
        """``fit.yaml`` of the ``tfdist.fit`` run there (``{}`` without one)."""
        if not self.fit_record.is_file():
            return {}
        try:
            record = yaml.safe_load(self.fit_record.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            record = e
        if not isinstance(record, dict):
            wrong = "it is empty" if record is None else type(record).__name__
            raise UserError(f"Cannot read {self.fit_record}: {wrong}. Expected the fit.yaml of an "
                            f"earlier tfdist.fit run (restore it, or remove the run directory), or a new {name}.")
        return record

    def write_fit_record(self, settings: Mapping[str, Any]) -> None:
        """Record ``tfdist.fit``'s ``settings`` (``FIT_RESUME_KEYS``) for its resumptions (``check_fit_settings``);
        once, when the run starts training, after every check (the first file a ``tfdist.fit`` run writes)."""
        if not self.fit_record.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            # Whole or not at all: the other workers read it (check_fit_settings) while the chief writes it.
            partial = self.fit_record.with_name(f".{self.fit_record.name}.{os.getpid()}")
            partial.write_text(yaml.safe_dump({"client": "tfdist.fit", **settings}))
            os.replace(partial, self.fit_record)

    def check_intact(self, name: str = "--model_dir") -> None:
        """Refuse a damaged run directory, before anything is written or trained over it.

        Every file a run leaves must be a file and every folder a folder; ``metrics.jsonl`` (and
        ``evaluator.jsonl``) one JSON object a line, ``summary.json`` one; ``checkpoints/checkpoint`` a checkpoint
        state naming a checkpoint that is there. A checkpoint state is written whole (written aside, then renamed),
        so a damaged one was damaged afterwards: resuming would start again from step 0 over the run's checkpoints.

        Raises:
            UserError: one line naming the file, what is wrong with it and what to do.
        """
        fix = f"restore it, or remove the run directory or use a new {name}"
        for path in (self.params, self.fit_record, self.metrics, self.evaluator_metrics, self.summary,
                     self.checkpoints / "checkpoint", self.exported_model):
            if os.path.lexists(path) and not path.is_file():
                raise UserError(f"Invalid {name} {self.path}: its {path.relative_to(self.path)} is not a file. "
                                f"Received: {article(damage.kind(path))}. Expected the file a run leaves there: {fix}.")
        for path in (self.checkpoints, self.path / "tensorboard", *map(self.tensorboard, TENSORBOARD_SPLITS),
                     self.export, self.saved_model, self.heartbeats, self.fit_inputs):
            if os.path.lexists(path) and not path.is_dir():
                raise UserError(f"Invalid {name} {self.path}: its {path.relative_to(self.path)} is not a "
                                f"directory. Received: {article(damage.kind(path))}. Expected the directory a run "
                                f"leaves there: {fix}.")
        for path in (self.metrics, self.evaluator_metrics):
            if path.is_file():
                damage.check_rows(path, name, self.path)
        if self.summary.is_file():
            damage.check_summary(self.summary, name, self.path)
        self._check_checkpoint_state(name)

    def _check_checkpoint_state(self, name: str) -> None:
        """``checkpoints/checkpoint``, when there: a checkpoint state whose latest checkpoint is there."""
        state_file = self.checkpoints / "checkpoint"
        if not state_file.is_file():
            return
        state = damage.read_state(state_file)
        latest = state.get("model_checkpoint_path", [""])[-1] if state is not None else ""
        if state is not None and latest and damage.files_there(self.checkpoints, latest):
            return
        older = [p for p in reversed(state.get("all_model_checkpoint_paths", []) if state else []) if p != latest]
        older += sorted((p.name[:-len(".index")] for p in self.checkpoints.glob("ckpt-*.index")),
                        key=damage.step_of, reverse=True)
        whole = next((p for p in older if damage.files_there(self.checkpoints, p)), None)
        then = (f"{whole}'s files are all there: write 'model_checkpoint_path: \"{whole}\"' into it to resume "
                "from that checkpoint" if whole else "no checkpoint's files are all there")
        wrong = (f"names {latest}, whose files are not there" if state is not None and latest else
                 "is empty" if state_file.stat().st_size == 0 else "is not a checkpoint state")
        raise UserError(f"Invalid {name} {self.path}: its checkpoints/checkpoint {wrong}; {then}. Expected a "
                        f"checkpoint state naming a checkpoint of the run, or a new {name}.")
