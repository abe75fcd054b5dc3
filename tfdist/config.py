"""The experiment configuration: a tree of frozen dataclasses, one precedence.

Precedence, applied in this order and nowhere else (as in TF Model Garden's
``ExperimentParser``): the defaults below, then a YAML experiment file
(``--config``), then flags, then ``validate``; the result is frozen and written
to ``params.yaml`` by the chief.

The runtime part (strategy, cluster, precision) is kept apart from the data,
model and training parts. Every field name is unique across the sections, so a
flat flag ``--image_size`` names exactly one field (``data.image_size``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from tfdist import strategies
from tfdist.cluster import sources
from tfdist.cluster.spec import ENVIRONMENT_CLUSTERS
from tfdist.errors import UserError, article

#: The ``--strategy`` names: the strategy registry's.
STRATEGIES = strategies.NAMES
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
DATASETS = ("shapes", "oxford_iiit_pet", "folder")
ENCODERS = ("unet", "mobilenetv2")
#: The ``--norm`` names (tfdist/models/unet.py): batch (exact, all-reduced), group (exact, no collective),
#: replica_batch (each replica its own statistics), none.
NORMS = ("batch", "group", "replica_batch", "none")
OPTIMIZERS = ("adam", "sgd")
LR_SCALINGS = ("none", "linear")
LR_DECAYS = ("cosine", "none")
COMMUNICATIONS = ("auto", "ring", "nccl")

#: Logical CPU devices one process may be split into: more than any host's cores, and TensorFlow grows
#: memory for each, so a larger ``--cpu_devices`` is a typo refused before TensorFlow starts.
MAX_CPU_DEVICES = 1024

#: Classes of each dataset when ``num_classes`` is left at 0.
DATASET_NUM_CLASSES = {"shapes": 4, "oxford_iiit_pet": 3}
#: Masks are 8-bit class indices; larger images than this do not fit a host's memory in a batch.
MAX_NUM_CLASSES, MAX_IMAGE_SIZE = 256, 4096


def _experiments_dir() -> Path:
    """The folder of the named experiments (``--config quick``): ``configs/experiments/``.

    setup.py ships that folder as the package data of ``tfdist.experiments``, so an
    installed wheel has it as ``tfdist/experiments/``, found with ``importlib.resources``.
    A checkout (``pip install -e .``, or tfdist on ``PYTHONPATH``) has no such folder
    beside its modules and uses the checkout's ``configs/experiments/`` itself.
    """
    import importlib.resources  # here, not at the top: only this function reads package data

    packaged = importlib.resources.files("tfdist").joinpath("experiments")
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "configs" / "experiments"


EXPERIMENTS_DIR = _experiments_dir()


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the run executes: strategy, devices, cluster, precision."""

    strategy: str = "mirrored"
    cpu_devices: int = 0  # 0: 2 logical CPUs for mirrored/central_storage without GPUs, else 1
    # A cluster spec file, "slurm" (the Slurm job step) or "kubernetes" (the pod); empty: TF_CONFIG, if any.
    cluster: str = ""
    task: str = ""  # "type:index" within --cluster (none with --cluster slurm)
    slurm_tasks: str = ""  # --cluster slurm: task types of the step, e.g. "worker=2,ps=1"; empty: all workers
    precision: str = "float32"
    jit_compile: bool = False
    communication: str = "auto"  # multi_worker_mirrored collective implementation
    bytes_per_pack: int = 0  # gradient packing for all-reduce; 0: TensorFlow's default
    collective_timeout: float = 0.0  # seconds; 0: no timeout
    connect_timeout: float = 120.0  # seconds to wait for cluster peers
    # seconds without a step (eval, checkpoint) that end the run, naming who is behind; 0: off
    progress_timeout: float = 1800.0
    ps_shards: int = 0  # 0 or 1: whole variables (Keras 3 cannot train partitioned ones: strategies.check_ps_shards)
    ps_min_shard_bytes: int = 256 << 10


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which data, at which size, and how the input pipeline treats it."""

    dataset: str = "shapes"
    data_dir: str = ""
    image_size: int = 32
    num_classes: int = 0  # 0: the dataset's own (shapes 4, oxford_iiit_pet 3)
    train_examples: int = 1024  # shapes only: size of the generated train split
    eval_examples: int = 256  # shapes only: size of the generated eval split
    augment: bool = True  # random horizontal flips on the train split
    cache: bool = True
    shuffle_buffer: int = 1024


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The UNet's shape."""

    encoder: str = "unet"
    base_filters: int = 16
    depth: int = 3
    batch_norm: bool = True  # False (--nobatch_norm): no normalization, as --norm none
    norm: str = "batch"  # batch (synchronized, exact), group (exact, no collective), replica_batch (per replica), none
    dropout: float = 0.0
    encoder_weights: str = ""  # mobilenetv2 only: a local weights file; empty: random init


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The optimisation: batch, schedule, optimizer, logging and checkpoints."""

    global_batch_size: int = 16
    epochs: int = 12
    steps_per_epoch: int = 0  # 0: train_examples // global_batch_size
    eval_steps: int = 0  # 0: the whole eval split
    optimizer: str = "adam"
    learning_rate: float = 2e-3
    lr_scaling: str = "none"
    reference_batch_size: int = 16  # lr_scaling=linear: lr * global_batch / reference
    warmup_steps: int = 0
    lr_decay: str = "cosine"  # cosine: decay to 0 over the run after warmup; none: constant
    seed: int = 0
    model_dir: str = ""  # empty: runs/<strategy>
    steps_per_loop: int = 0  # 0: the strategy's default (1; strategies.PS_STEPS_PER_LOOP for parameter_server)
    log_every: int = 16
    checkpoint_every: int = 100
    deterministic: bool = False  # enable TF op determinism; turns augmentation off
    export: bool = True  # write export/ (model.keras, SavedModel) at the end; --noexport for throwaway runs
    ema_momentum: float = 0.0  # > 0: keep Keras' moving average of the weights (use_ema) and export it


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole experiment."""

    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}
_SECTION_CLASSES = {"runtime": RuntimeConfig, "data": DataConfig, "model": ModelConfig, "train": TrainConfig}

#: Flat field name -> section name; field names are unique across sections.
FIELD_SECTION = {
    field.name: section for section, cls in _SECTION_CLASSES.items() for field in dataclasses.fields(cls)
}


def _coerce(section: str, name: str, value: Any, where: str) -> Any:
    """Check ``value`` against the field's declared type; ints are accepted for floats."""
    default = getattr(_SECTION_CLASSES[section](), name)
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise UserError(
            f"Invalid value for `{section}.{name}` in {where}. Received: {name}={value!r}. "
            f"Expected {article(kind.__name__)}."
        )
    return value


def override(config: Config, values: Mapping[str, Any], where: str = "flags") -> Config:
    """Return ``config`` with flat ``field -> value`` overrides applied."""
    per_section: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        section = FIELD_SECTION.get(name)
        if section is None:
            raise UserError(
                f"Unknown setting in {where}. Received: {name!r}. Expected one of: {', '.join(sorted(FIELD_SECTION))}."
            )
        per_section.setdefault(section, {})[name] = _coerce(section, name, value, where)
    return dataclasses.replace(
        config,
        **{s: dataclasses.replace(getattr(config, s), **v) for s, v in per_section.items()},
    )


def runtime_config(where: str, **values: Any) -> RuntimeConfig:
    """The ``RuntimeConfig`` of an API call's arguments (``where``: ``tfdist.fit``), each checked for its type."""
    return override(Config(), values, where=where).runtime


def path_text(value: Any) -> Any:
    """An API's path argument as the config holds it: a ``str`` (``""`` for None); anything else as it is (refused)."""
    return "" if value is None else os.fspath(value) if isinstance(value, os.PathLike) else value


def resolve_experiment_path(name: str) -> Path:
    """``--config`` takes a path, or a name from ``configs/experiments/`` (with or without .yaml)."""
    candidates = [Path(name)]
    if not name.endswith((".yaml", ".yml")):
        candidates.append(EXPERIMENTS_DIR / f"{name}.yaml")
    candidates.append(EXPERIMENTS_DIR / name)
    for path in candidates:
        if path.is_file():
            return path
    known = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))
    raise UserError(
        f"Invalid value for `--config`. Received: {name!r}, which is not a file. "
        f"Expected a YAML path or one of: {', '.join(known) or '(none)'}."
    )


class _DuplicateKey(Exception):
    """A key given twice in one mapping of a YAML file (YAML itself forbids it; PyYAML keeps the last)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping with both of its line numbers."""

    def construct_mapping(self, node, deep=False):
        lines: dict = {}
        for key_node, _ in node.value:
            key, line = key_node.value, key_node.start_mark.line + 1  # a scalar key's text, as the file has it
            if isinstance(key, str) and key in lines:
                raise _DuplicateKey(f"the key {key!r} is given twice, on lines {lines[key]} and {line}")
            lines[key if isinstance(key, str) else object()] = line
        return super().construct_mapping(node, deep=deep)


def load_experiment(config: Config, name: str) -> Config:
    """Apply a YAML experiment file: top-level sections, each a mapping of fields."""
    path = resolve_experiment_path(name)
    try:
        tree = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except _DuplicateKey as e:
        raise UserError(f"Invalid experiment file {path}: {e}. Expected each key once.") from None
    except UnicodeDecodeError as e:
        raise UserError(f"Invalid experiment file {path}: it is not UTF-8 text. Received: byte "
                        f"{e.object[e.start:e.start + 1]!r} at offset {e.start}. Expected a UTF-8 YAML file.") from None
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"Cannot read experiment file {path}: {type(e).__name__}: {e}") from None
    if tree is None:
        return config
    if not isinstance(tree, dict):
        raise UserError(
            f"Invalid experiment file {path}. Received a top level of type {type(tree).__name__}. "
            f"Expected a mapping with sections {', '.join(SECTIONS)}."
        )
    flat: dict[str, Any] = {}
    for section, fields in tree.items():
        if section not in SECTIONS:
            raise UserError(
                f"Unknown section in experiment file {path}. "
                f"Received: {section!r}. Expected one of: {', '.join(SECTIONS)}."
            )
        if not isinstance(fields, dict):
            raise UserError(
                f"Invalid section `{section}` in experiment file {path}. Received: {fields!r}. Expected a mapping."
            )
        for name, value in fields.items():
            if FIELD_SECTION.get(name) != section:
                known = [f.name for f in dataclasses.fields(_SECTION_CLASSES[section])]
                raise UserError(
                    f"Unknown key `{section}.{name}` in experiment file {path}. Expected one of: {', '.join(known)}."
                )
            flat[name] = value
    return override(config, flat, where=str(path))


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"Invalid value for `--{name}`. "
                        f"Received: {name}={value!r}. Expected one of: {', '.join(choices)}.")


def resolve_norm(norm: str, batch_norm: bool) -> str:
    """The normalization that ``norm`` and the older ``batch_norm`` switch ask for together.

    ``batch_norm=False`` (``--nobatch_norm``) means no normalization: it turns the default ``"batch"``
    into ``"none"``; with ``"group"`` or ``"replica_batch"`` the pair contradicts itself and is refused.
    """
    _choice("norm", norm, NORMS)
    if batch_norm:
        return norm
    if norm not in ("batch", "none"):
        raise UserError(
            f"Invalid value for `--norm` with --nobatch_norm. Received: norm={norm!r} and batch_norm=False. "
            f"Expected norm='none' (or no --norm) with --nobatch_norm, or --batch_norm with norm={norm!r}."
        )
    return "none"


def _at_least(name: str, value: float, low: float) -> None:
    if not value >= low:  # also catches NaN
        raise UserError(f"Invalid value for `--{name}`. Received: {name}={value!r}. Expected a number >= {low}.")


def _check_magnitudes(config: Config) -> None:
    """Every int fits TensorFlow's int64, and every float is finite (a timeout of 0 is the one that means "off")."""
    for name, section in FIELD_SECTION.items():
        value = getattr(getattr(config, section), name)
        expected = ("an integer below 2**63" if type(value) is int and not -(2**63) <= value < 2**63 else
                    "a finite number" if type(value) is float and not math.isfinite(value) else None)
        if expected:
            raise UserError(f"Invalid value for `--{name}`. Received: {name}={value!r}. Expected {expected}.")


def validate(config: Config) -> Config:
    """Check every field and fill the values that derive from others; returns the final config."""
    rt, data, model, train = config.runtime, config.data, config.model, config.train
    _choice("strategy", rt.strategy, STRATEGIES)
    _choice("precision", rt.precision, PRECISIONS)
    _choice("communication", rt.communication, COMMUNICATIONS)
    _choice("dataset", data.dataset, DATASETS)
    _choice("encoder", model.encoder, ENCODERS)
    norm = resolve_norm(model.norm, model.batch_norm)
    model = dataclasses.replace(model, norm=norm, batch_norm=norm != "none")
    _choice("optimizer", train.optimizer, OPTIMIZERS)
    _choice("lr_scaling", train.lr_scaling, LR_SCALINGS)
    _choice("lr_decay", train.lr_decay, LR_DECAYS)
    for name, low in (
        ("cpu_devices", 0), ("bytes_per_pack", 0), ("collective_timeout", 0), ("connect_timeout", 1),
        ("progress_timeout", 0),
        ("ps_shards", 0), ("ps_min_shard_bytes", 1), ("image_size", 8), ("num_classes", 0),
        ("train_examples", 1), ("eval_examples", 1), ("shuffle_buffer", 1), ("base_filters", 1),
        ("depth", 1), ("dropout", 0), ("global_batch_size", 1), ("epochs", 1), ("steps_per_epoch", 0),
        ("eval_steps", 0), ("reference_batch_size", 1), ("warmup_steps", 0), ("steps_per_loop", 0),
        ("log_every", 1), ("checkpoint_every", 1),
    ):
        _at_least(name, getattr(getattr(config, FIELD_SECTION[name]), name), low)
    _check_magnitudes(config)
    if rt.cpu_devices > MAX_CPU_DEVICES:
        raise UserError(f"Invalid value for `--cpu_devices`. Received: cpu_devices={rt.cpu_devices}. "
                        f"Expected an integer in 0..{MAX_CPU_DEVICES} (0: the strategy's default).")
    if not 0 <= train.seed < 2**32:
        raise UserError(f"Invalid value for `--seed`. Received: seed={train.seed}. Expected an integer in 0..2**32-1.")
    strategies.check_ps_shards(rt.ps_shards)
    if not (0 <= model.dropout < 1):
        raise UserError("Invalid value for `--dropout`. "
                        f"Received: dropout={model.dropout!r}. Expected 0 <= dropout < 1.")
    if not (train.learning_rate > 0 and math.isfinite(train.learning_rate)):
        raise UserError(
            "Invalid value for `--learning_rate`. "
            f"Received: learning_rate={train.learning_rate!r}. Expected a finite number > 0."
        )
    if not (0 <= train.ema_momentum < 1):
        raise UserError("Invalid value for `--ema_momentum`. "
                        f"Received: ema_momentum={train.ema_momentum!r}. Expected 0 (no moving average) or "
                        "0 < ema_momentum < 1.")
    if data.dataset == "folder" and not data.data_dir:
        raise UserError("Invalid value for `--data_dir`. "
                        "Received: data_dir=''. Expected a directory with images/ and masks/ for dataset=folder.")
    num_classes = data.num_classes or DATASET_NUM_CLASSES.get(data.dataset, 0)
    if num_classes == 0:
        raise UserError(f"Missing `--num_classes` for dataset={data.dataset!r}. "
                        "Received: num_classes=0. Expected an integer >= 2.")
    if num_classes < 2:
        raise UserError("Invalid value for `--num_classes`. "
                        f"Received: num_classes={num_classes}. Expected an integer >= 2.")
    if num_classes > MAX_NUM_CLASSES or data.image_size > MAX_IMAGE_SIZE:
        raise UserError(f"Invalid value for `--{'num_classes' if num_classes > MAX_NUM_CLASSES else 'image_size'}`. "
                        f"Received: num_classes={num_classes}, image_size={data.image_size}. Expected num_classes <= "
                        f"{MAX_NUM_CLASSES} (masks hold 8-bit class indices) and image_size <= {MAX_IMAGE_SIZE}.")
    if data.dataset == "shapes" and num_classes < DATASET_NUM_CLASSES["shapes"]:
        raise UserError(f"Invalid value for `--num_classes` for shapes. Received: num_classes={num_classes}. Expected "
                        f"at least {DATASET_NUM_CLASSES['shapes']} (background and three shapes), or no --num_classes.")
    if data.dataset == "oxford_iiit_pet" and num_classes != 3:
        raise UserError("Invalid value for `--num_classes` for oxford_iiit_pet. "
                        f"Received: num_classes={num_classes}. Expected 3 (pet, background, border).")
    if model.encoder == "unet" and data.image_size % (2**model.depth):
        raise UserError(
            f"Invalid value for `--image_size`. Received: image_size={data.image_size} with depth={model.depth}. "
            f"Expected a multiple of 2**depth={2**model.depth}."
        )
    if model.encoder_weights:
        check_encoder_weights(model.encoder, model.encoder_weights)
    sources.check_flags(rt.cluster, rt.task, rt.slurm_tasks)
    if rt.cluster and rt.cluster not in ENVIRONMENT_CLUSTERS and not rt.task:
        raise UserError(f"Missing `--task` for --cluster={rt.cluster}. "
                        "Received: task=''. Expected type:index, e.g. worker:0.")
    if rt.task and not rt.cluster:
        raise UserError(f"Missing `--cluster` for --task={rt.task}. "
                        "Received: cluster=''. Expected a cluster spec file.")
    data = dataclasses.replace(data, num_classes=num_classes, augment=data.augment and not train.deterministic)
    model_dir = train.model_dir or str(Path("runs") / rt.strategy)
    steps_per_loop = train.steps_per_loop or strategies.traits(rt.strategy).default_steps_per_loop
    return dataclasses.replace(
        config, data=data, model=model,
        train=dataclasses.replace(train, model_dir=model_dir, steps_per_loop=steps_per_loop),
    )


#: The first bytes of the weights files Keras loads: HDF5 (``.h5``, ``.weights.h5``) and zip (``.keras``).
WEIGHTS_SIGNATURES = {".h5": b"\x89HDF\r\n\x1a\n", ".keras": b"PK\x03\x04"}


def check_encoder_weights(encoder: str, path: str) -> None:
    """Refuse ``--encoder_weights`` that Keras could not load: another encoder, or not a weights file."""
    expected = "Expected a local MobileNetV2 weights file (.h5 or .keras) with --encoder=mobilenetv2."
    if encoder != "mobilenetv2":
        raise UserError(f"Unexpected `--encoder_weights` with encoder={encoder!r}. Received: encoder_weights={path!r}. "
                        f"{expected}")
    try:
        head = Path(path).read_bytes()[:8]  # a directory or a missing file: OSError
    except OSError as e:
        raise UserError(f"Invalid value for `--encoder_weights`: {e.strerror or type(e).__name__}. "
                        f"Received: encoder_weights={path!r}. {expected}") from None
    if not head.startswith(WEIGHTS_SIGNATURES.get(Path(path).suffix.lower(), b"-")):
        raise UserError(f"Invalid value for `--encoder_weights`: not an HDF5 or .keras file. "
                        f"Received: encoder_weights={path!r}. {expected}")


def build_config(experiment: str | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults -> experiment file -> overrides -> validate: the one precedence."""
    config = Config()
    if experiment:
        config = load_experiment(config, experiment)
    if overrides:
        config = override(config, overrides)
    return validate(config)


def to_dict(config: Config) -> dict[str, dict[str, Any]]:
    """The config as nested plain dicts (the shape of ``params.yaml``)."""
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    """The config as YAML that ``load_experiment`` reads back to the same config."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
