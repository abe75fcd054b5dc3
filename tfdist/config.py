"""A run's configuration: the one precedence (defaults -> YAML file -> flags -> validate), and the runtime section.

A configuration is a tree: a frozen dataclass of sections, each a frozen dataclass whose field names are unique
across the tree, so that a flag ``--strategy`` names one field. An experiment brings its sections and ``validate``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import yaml

from tfdist import strategies
from tfdist.cluster import sources
from tfdist.cluster.spec import ENVIRONMENT_CLUSTERS
from tfdist.errors import UserError, article

Tree = TypeVar("Tree")

#: The ``--strategy`` names: the strategy registry's, and ``auto`` (``resolve_strategy``).
STRATEGIES = (*strategies.NAMES, strategies.AUTO)
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
COMMUNICATIONS = ("auto", "ring", "nccl")

#: Logical CPU devices one process may be split into: more than any host's cores, and TensorFlow grows
#: memory for each, so a larger ``--cpu_devices`` is a typo refused before TensorFlow starts.
MAX_CPU_DEVICES = 1024


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

    strategy: str = strategies.AUTO  # resolve_strategy: the cluster's, else mirrored over several devices, else one
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


#: The least value of each number of ``RuntimeConfig``.
RUNTIME_MINIMUMS = (("cpu_devices", 0), ("bytes_per_pack", 0), ("collective_timeout", 0), ("connect_timeout", 1),
                    ("progress_timeout", 0))


@dataclasses.dataclass(frozen=True)
class RetiredRuntime:
    """Runtime settings that are gone, typed and defaulted as they were: a command line or an experiment file (an
    older run's ``params.yaml``) may still give them, and what they asked for is what tfdist always does."""

    ps_shards: int = 0  # 0 or 1: whole variables; more asked for variable partitioning (check_retired)
    ps_min_shard_bytes: int = 256 << 10  # the least size of a partitioned variable's shard


#: Each retired setting (``RetiredRuntime``) -> why it has no effect, for the note of a command that is given it.
RETIRED = {
    "ps_shards": "parameter_server keeps each variable whole on one ps task, spread over its ps tasks round-robin",
    "ps_min_shard_bytes": "it sized the shards of partitioned variables, which parameter_server does not make",
}
#: The least value of each retired setting, as it was.
RETIRED_MINIMUMS = {"ps_shards": 0, "ps_min_shard_bytes": 1}


def check_retired(name: str, value: int) -> None:
    """Refuse a retired setting's value that it never took, or that asks for what does not work.

    ``ps_shards`` above 1 asked for variable partitioning, which Keras 3 cannot train: with a variable
    partitioner ``ParameterServerStrategy`` makes each large variable a ``ShardedVariable``, which a Keras 3
    variable wraps whole; ``tape.gradient`` asks it for its ``handle``, which it does not have ("'ShardedVariable'
    object has no attribute 'handle'"), and taking the gradients per shard instead fails in the Keras optimizer's
    update ("ShardedVariable doesn't support being used as a reference", on TF 2.21 + Keras 3.15). Without a
    partitioner the strategy still spreads whole variables over every ps task (round-robin).
    """
    check_at_least(name, value, RETIRED_MINIMUMS[name])
    check_magnitude(name, value)
    if name == "ps_shards" and value > 1:
        raise UserError(
            f"Invalid value for `--ps_shards`: variable partitioning does not work with Keras 3 (its variables "
            f"cannot wrap TensorFlow's ShardedVariable). Received: ps_shards={value!r}. Expected 0 or 1: "
            f"whole variables, which parameter_server spreads over all its ps tasks."
        )


@dataclasses.dataclass(frozen=True)
class _RuntimeOnly:
    """The tree of an API call's run arguments (``runtime_config``): the runtime section alone."""

    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)


def sections(tree) -> dict[str, type]:
    """Section name -> its dataclass, in order, of a config tree (a tree class, or a tree)."""
    default = tree() if isinstance(tree, type) else tree
    return {f.name: type(getattr(default, f.name)) for f in dataclasses.fields(default)}


def field_sections(tree) -> dict[str, str]:
    """Flat field name -> its section, for a config tree: the flag ``--image_size`` names ``data.image_size``."""
    return {field.name: section for section, cls in sections(tree).items() for field in dataclasses.fields(cls)}


def _coerce(section: str, cls: type, name: str, value: Any, where: str) -> Any:
    """Check ``value`` against the field's declared type; ints are accepted for floats."""
    kind = type(getattr(cls(), name))
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


def override(config: Tree, values: Mapping[str, Any], where: str = "flags") -> Tree:
    """Return ``config`` (a config tree) with flat ``field -> value`` overrides applied, each checked for its type.

    A retired setting of a tree with a runtime section (``RETIRED``) is checked (``check_retired``) and left out.
    """
    classes, owner = sections(config), field_sections(config)
    per_section: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name in RETIRED and "runtime" in classes:
            check_retired(name, _coerce("runtime", RetiredRuntime, name, value, where))
            continue
        section = owner.get(name)
        if section is None:
            raise UserError(
                f"Unknown setting in {where}. Received: {name!r}. Expected one of: {', '.join(sorted(owner))}."
            )
        per_section.setdefault(section, {})[name] = _coerce(section, classes[section], name, value, where)
    return dataclasses.replace(
        config,
        **{s: dataclasses.replace(getattr(config, s), **v) for s, v in per_section.items()},
    )


def runtime_config(where: str, **values: Any) -> RuntimeConfig:
    """The ``RuntimeConfig`` of an API call's arguments (``where``: ``tfdist.fit``), each checked for its type."""
    return override(_RuntimeOnly(), values, where=where).runtime


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


def load_experiment(config: Tree, name: str) -> Tree:
    """Apply a YAML experiment file to ``config`` (a config tree): top-level sections, each a mapping of fields."""
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
    classes, owner = sections(config), field_sections(config)
    if not isinstance(tree, dict):
        raise UserError(
            f"Invalid experiment file {path}. Received a top level of type {type(tree).__name__}. "
            f"Expected a mapping with sections {', '.join(classes)}."
        )
    flat: dict[str, Any] = {}
    for section, fields in tree.items():
        if section not in classes:
            raise UserError(
                f"Unknown section in experiment file {path}. "
                f"Received: {section!r}. Expected one of: {', '.join(classes)}."
            )
        if not isinstance(fields, dict):
            raise UserError(
                f"Invalid section `{section}` in experiment file {path}. Received: {fields!r}. Expected a mapping."
            )
        for name, value in fields.items():
            if owner.get(name) != section and not (section == "runtime" and name in RETIRED):
                known = [f.name for f in dataclasses.fields(classes[section])]
                raise UserError(
                    f"Unknown key `{section}.{name}` in experiment file {path}. Expected one of: {', '.join(known)}."
                )
            flat[name] = value
    return override(config, flat, where=str(path))


def build(defaults: Tree, validate: Callable[[Tree], Tree], experiment: str | None = None,
          overrides: Mapping[str, Any] | None = None) -> Tree:
    """Defaults -> experiment file -> overrides -> ``validate``: the one precedence, for a config tree."""
    config = defaults
    if experiment:
        config = load_experiment(config, experiment)
    if overrides:
        config = override(config, overrides)
    return validate(config)


def to_dict(config) -> dict[str, dict[str, Any]]:
    """A config tree as nested plain dicts (the shape of ``params.yaml``)."""
    return dataclasses.asdict(config)


def to_yaml(config) -> str:
    """A config tree as YAML that ``load_experiment`` reads back to the same tree."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Refuse a ``--name`` that is not one of ``choices``."""
    if value not in choices:
        raise UserError(f"Invalid value for `--{name}`. "
                        f"Received: {name}={value!r}. Expected one of: {', '.join(choices)}.")


def check_at_least(name: str, value: float, low: float) -> None:
    """Refuse a ``--name`` below ``low`` (or NaN)."""
    if not value >= low:  # also catches NaN
        raise UserError(f"Invalid value for `--{name}`. Received: {name}={value!r}. Expected a number >= {low}.")


def check_magnitude(name: str, value: Any) -> None:
    """An int fits TensorFlow's int64, and a float is finite (a timeout of 0 is the one that means "off")."""
    expected = ("an integer below 2**63" if type(value) is int and not -(2**63) <= value < 2**63 else
                "a finite number" if type(value) is float and not math.isfinite(value) else None)
    if expected:
        raise UserError(f"Invalid value for `--{name}`. Received: {name}={value!r}. Expected {expected}.")


def check_magnitudes(section) -> None:
    """``check_magnitude`` of every field of one section."""
    for field in dataclasses.fields(section):
        check_magnitude(field.name, getattr(section, field.name))


#: The most steps a run counts: its step counter is an int64 variable.
MAX_STEPS = 2**63 - 1


def check_total_steps(epochs: int, steps_per_epoch: int, *, epochs_name: str = "--epochs",
                      steps_name: str = "--steps_per_epoch") -> None:
    """Refuse ``epochs`` epochs of ``steps_per_epoch`` steps, more than the step counter (an int64) counts.

    ``epochs_name`` and ``steps_name``: how the caller's user gave them (``--epochs``, or ``epochs`` of
    ``tfdist.fit``).
    """
    if epochs * steps_per_epoch > MAX_STEPS:
        raise UserError(f"Invalid `{epochs_name}` with `{steps_name}`: more steps than a run counts. Received: "
                        f"{epochs_name.lstrip('-')}={epochs} epochs of {steps_name.lstrip('-')}={steps_per_epoch} "
                        f"steps, {epochs * steps_per_epoch} steps. Expected at most 2**63-1 steps in all (the step "
                        "counter is an int64).")


def check_seed(seed: int) -> None:
    """A seed that Keras' ``set_random_seed`` (and NumPy's) takes: 0..2**32-1."""
    check_magnitude("seed", seed)
    if not 0 <= seed < 2**32:
        raise UserError(f"Invalid value for `--seed`. Received: seed={seed}. Expected an integer in 0..2**32-1.")


def check_runtime(rt: RuntimeConfig) -> None:
    """Every check of the runtime section, the one list that each front door calls (``tfdist.train``'s config
    through ``validate_runtime``, ``tfdist.fit``'s run arguments, ``tfdist.setup``): its names, bounds and
    magnitudes, its logical CPUs, then its cluster flags (``--cluster``, ``--task`` and ``--slurm_tasks`` fit
    together). Reads no file and starts no TensorFlow."""
    check_choice("strategy", rt.strategy, STRATEGIES)
    check_choice("precision", rt.precision, PRECISIONS)
    check_choice("communication", rt.communication, COMMUNICATIONS)
    for name, low in RUNTIME_MINIMUMS:
        check_at_least(name, getattr(rt, name), low)
    check_magnitudes(rt)
    if rt.cpu_devices > MAX_CPU_DEVICES:
        raise UserError(f"Invalid value for `--cpu_devices`. Received: cpu_devices={rt.cpu_devices}. "
                        f"Expected an integer in 0..{MAX_CPU_DEVICES} (0: the strategy's default).")
    sources.check_flags(rt.cluster, rt.task, rt.slurm_tasks)
    if rt.cluster and rt.cluster not in ENVIRONMENT_CLUSTERS and not rt.task:
        raise UserError(f"Missing `--task` for --cluster={rt.cluster}. "
                        "Received: task=''. Expected type:index, e.g. worker:0.")
    if rt.task and not rt.cluster:
        raise UserError(f"Missing `--cluster` for --task={rt.task}. "
                        "Received: cluster=''. Expected a cluster spec file.")


def steps_per_loop(rt: RuntimeConfig, given: int) -> int:
    """``--steps_per_loop``: ``given``, or for 0 the strategy's default (1; more under ``parameter_server``)."""
    return given or strategies.traits(rt.strategy).default_steps_per_loop


def resolve_strategy(rt: RuntimeConfig, cluster_resolver=None) -> RuntimeConfig:
    """``rt`` with ``strategy="auto"`` replaced by the strategy it stands for (``strategies.auto_strategy``):

    - a cluster (``--cluster``, TF_CONFIG, Slurm, Kubernetes, or an in-process ``cluster_resolver``):
      ``parameter_server`` when it has ps tasks, else ``multi_worker_mirrored``;
    - else ``mirrored`` when this process sees several GPUs (``strategies.visible_gpus``) or is given
      ``cpu_devices`` > 1, else ``one_device``.

    Runs after the checks of the flags it reads (``sources.cluster_task_types``); starts no TensorFlow.
    """
    if rt.strategy != strategies.AUTO:
        return rt
    if cluster_resolver is not None:
        types = frozenset(cluster_resolver.cluster_spec().as_dict())
    else:
        types = sources.cluster_task_types(rt.cluster or None, rt.task or None, slurm_tasks=rt.slurm_tasks)
    devices = strategies.visible_gpus() or rt.cpu_devices
    return dataclasses.replace(rt, strategy=strategies.auto_strategy(types, local_devices=devices))


def validate_runtime(rt: RuntimeConfig, cluster_resolver=None) -> RuntimeConfig:
    """Check every field of the runtime section (``check_runtime``); returns it with its strategy resolved
    (``resolve_strategy``)."""
    check_runtime(rt)
    return resolve_strategy(rt, cluster_resolver)
