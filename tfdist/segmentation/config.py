"""The UNet experiment's configuration: its runtime, data, model and train sections, and ``validate``, their checks.

Every field name is unique across the sections, so a flag ``--image_size`` names one field (``data.image_size``);
``build_config`` resolves them in the one precedence of ``tfdist.config``, and the chief writes ``params.yaml``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping

from tfdist import config as config_lib
from tfdist import strategies
from tfdist import data as data_lib
from tfdist.config import RuntimeConfig, check_at_least, check_choice
from tfdist.errors import UserError, special_file
from tfdist.models.norms import resolve_norm

DATASETS = tuple(data_lib.DATASETS)
ENCODERS = ("unet", "mobilenetv2")
OPTIMIZERS = ("adam", "sgd")
LR_SCALINGS = ("none", "linear")
LR_DECAYS = ("cosine", "none")

#: Masks are 8-bit class indices; larger images than this do not fit a host's memory in a batch.
MAX_NUM_CLASSES, MAX_IMAGE_SIZE = 256, 4096
#: The most filters of the UNet's widest layer (``base_filters * 2**depth``): one 3x3 convolution of that width
#: already holds 600 MB of weights.
MAX_FILTERS = 4096


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


#: Section name -> its dataclass.
SECTIONS = config_lib.sections(Config)
#: Flat field name -> section name; field names are unique across sections.
FIELD_SECTION = config_lib.field_sections(Config)

#: The least value of each number of the data, model and train sections.
MINIMUMS = (("image_size", 8), ("num_classes", 0), ("train_examples", 1), ("eval_examples", 1),
            ("shuffle_buffer", 1), ("base_filters", 1), ("depth", 1), ("dropout", 0), ("global_batch_size", 1),
            ("epochs", 1), ("steps_per_epoch", 0), ("eval_steps", 0), ("reference_batch_size", 1),
            ("warmup_steps", 0), ("steps_per_loop", 0), ("log_every", 1), ("checkpoint_every", 1))


def validate(config: Config) -> Config:
    """Check every field and fill the values that derive from others; returns the final config.

    The runtime section first, with its strategy resolved (``config.validate_runtime``, every front door's
    runtime check); then this experiment's sections: names, bounds, magnitudes, then the checks of several fields.
    """
    rt = config_lib.validate_runtime(config.runtime)
    data, model, train = config.data, config.model, config.train
    check_choice("dataset", data.dataset, DATASETS)
    check_choice("encoder", model.encoder, ENCODERS)
    norm = resolve_norm(model.norm, model.batch_norm)
    model = dataclasses.replace(model, norm=norm, batch_norm=norm != "none")
    check_choice("optimizer", train.optimizer, OPTIMIZERS)
    check_choice("lr_scaling", train.lr_scaling, LR_SCALINGS)
    check_choice("lr_decay", train.lr_decay, LR_DECAYS)
    for name, low in MINIMUMS:
        check_at_least(name, getattr(getattr(config, FIELD_SECTION[name]), name), low)
    for section in (data, model, train):
        config_lib.check_magnitudes(section)
    config_lib.check_total_steps(train.epochs, train.steps_per_epoch or 1)
    config_lib.check_seed(train.seed)
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
    data = _check_data(data, model)
    if model.encoder_weights:
        check_encoder_weights(model.encoder, model.encoder_weights)
    data = dataclasses.replace(data, augment=data.augment and not train.deterministic)
    model_dir = train.model_dir or str(Path("runs") / rt.strategy)
    return dataclasses.replace(
        config, runtime=rt, data=data, model=model,
        train=dataclasses.replace(train, model_dir=model_dir,
                                  steps_per_loop=config_lib.steps_per_loop(rt, train.steps_per_loop)),
    )


def check_training(config: Config, placement, *, in_process_cluster: bool) -> None:
    """What a training task checks before TensorFlow starts: its dataset, and the global batch over the replicas.

    The replicas are known from the strategy, ``--cpu_devices``, the cluster and the visible GPUs
    (``strategies.replicas_in_sync``); a cluster made in this process is checked once its strategy exists.
    """
    from tfdist import data as data_lib

    data_lib.validate_data(config.data)  # a bad dataset is one line on stderr
    if not in_process_cluster:
        replicas = strategies.replicas_in_sync(placement.traits, cpu_devices=config.runtime.cpu_devices,
                                               task=placement.task)
        strategies.check_global_batch(config.train.global_batch_size, replicas)


def _check_data(data: DataConfig, model: ModelConfig) -> DataConfig:
    """The data section's checks that read the dataset and the model; returns it with its classes filled."""
    dataset = data_lib.dataset(data.dataset)
    num_classes = data.num_classes or dataset.num_classes
    if dataset.data_dir and not data.data_dir:
        raise UserError(f"Invalid value for `--data_dir`. Received: data_dir=''. Expected {dataset.data_dir} for "
                        f"dataset={data.dataset}.")
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
    dataset.check_classes(data, num_classes)
    if model.encoder == "unet" and data.image_size % (2**model.depth):
        raise UserError(
            f"Invalid value for `--image_size`. Received: image_size={data.image_size} with depth={model.depth}. "
            f"Expected a multiple of 2**depth={2**model.depth}."
        )
    widest = model.base_filters * 2**model.depth if model.encoder == "unet" else model.base_filters
    if widest > MAX_FILTERS:
        raise UserError(f"Invalid value for `--base_filters`. Received: base_filters={model.base_filters} with "
                        f"encoder={model.encoder}, depth={model.depth}: {widest} filters in the widest layer. "
                        f"Expected at most {MAX_FILTERS} (base_filters * 2**depth for the unet encoder).")
    return dataclasses.replace(data, num_classes=num_classes)


#: The first bytes of the weights files Keras loads: HDF5 (``.h5``, ``.weights.h5``) and zip (``.keras``).
WEIGHTS_SIGNATURES = {".h5": b"\x89HDF\r\n\x1a\n", ".keras": b"PK\x03\x04"}


def check_encoder_weights(encoder: str, path: str) -> None:
    """Refuse ``--encoder_weights`` that Keras could not load: another encoder, or not a weights file."""
    expected = "Expected a local MobileNetV2 weights file (.h5 or .keras) with --encoder=mobilenetv2."
    if encoder != "mobilenetv2":
        raise UserError(f"Unexpected `--encoder_weights` with encoder={encoder!r}. Received: encoder_weights={path!r}. "
                        f"{expected}")
    special = special_file(path)
    if special:  # reading a FIFO waits for a writer
        raise UserError(f"Invalid value for `--encoder_weights`: {path} is {special}, not a regular file. "
                        f"Received: encoder_weights={path!r}. {expected}")
    try:
        head = Path(path).read_bytes()[:8]  # a directory or a missing file: OSError
    except OSError as e:
        raise UserError(f"Invalid value for `--encoder_weights`: {e.strerror or type(e).__name__}. "
                        f"Received: encoder_weights={path!r}. {expected}") from None
    if not head.startswith(WEIGHTS_SIGNATURES.get(Path(path).suffix.lower(), b"-")):
        raise UserError(f"Invalid value for `--encoder_weights`: not an HDF5 or .keras file. "
                        f"Received: encoder_weights={path!r}. {expected}")


def build_config(experiment: str | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults -> experiment file -> overrides -> validate: the one precedence, for the UNet experiment."""
    return config_lib.build(Config(), validate, experiment, overrides)
