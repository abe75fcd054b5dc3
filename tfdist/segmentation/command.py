"""``tfdist.train``'s command line: its flags, its main, and the check of one that other hosts will run.

Every config field is a flag of the same name, typed and defaulted as the field is, beside ``--config`` and
``--dump_weights``. ``entry`` runs the command (``tfdist.train``'s, and with hooks the benchmark's preempted run).
``check_command`` parses a command line that ``tfconfig --commands``/``tfdist.manifest`` puts in every task or
pod with those same flags, so that a typo is one line where it is written, not a failure on every pod.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Sequence

from absl import flags

from tfdist import config as config_lib
from tfdist import strategies
from tfdist.segmentation import config as experiment_config
from tfdist.cli import only_flags, run_main
from tfdist.errors import UserError, check_directory, resolve_dots

_DEFINE = {bool: flags.DEFINE_boolean, int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string}

#: The flags a task's place in the cluster comes from: the deployment sets them, never the command after ``--``.
PLACEMENT_FLAGS = ("cluster", "task", "slurm_tasks")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """``--config``, ``--dump_weights`` and one flag per config field, typed and defaulted as the field is."""
    flags.DEFINE_string("config", None, "A YAML experiment: a path, or a name in configs/experiments/.",
                        flag_values=flag_values)
    flags.DEFINE_string("dump_weights", None, "Every training task writes its final weights to "
                        "DIR/<type>-<index>.npz (local.npz without a cluster): to compare workers that write no "
                        "outputs. Not part of the config.", flag_values=flag_values)
    for section in dataclasses.fields(experiment_config.Config):
        defaults = section.default_factory()
        for field in dataclasses.fields(defaults):
            default = getattr(defaults, field.name)
            _DEFINE[type(default)](field.name, default, f"{section.name}.{field.name}", flag_values=flag_values)
    for field in dataclasses.fields(config_lib.RetiredRuntime):
        _DEFINE[type(field.default)](field.name, field.default, f"Deprecated, no effect: "
                                     f"{config_lib.RETIRED[field.name]}.", flag_values=flag_values)


def given_fields(flag_values: flags.FlagValues = flags.FLAGS) -> dict:
    """The config fields given on the command line, as flat ``field -> value`` overrides (a retired one too,
    which ``config.override`` checks and leaves out)."""
    names = (*experiment_config.FIELD_SECTION, *config_lib.RETIRED)
    return {name: flag_values[name].value for name in names if flag_values[name].present}


def check_dump_weights(path: str) -> None:
    """Refuse a ``--dump_weights`` that cannot be a directory or cannot be written, before anything runs."""
    check_directory(path, "--dump_weights", "Expected a directory for the weights files (existing or new).")


#: The flags that name a directory every training task makes.
DIRECTORY_FLAGS = ("model_dir", "dump_weights")

#: The kernel's own file systems: no directory can be made under them on any host.
KERNEL_FILESYSTEMS = ("/proc", "/sys")


def _check_not_empty(values: flags.FlagValues, where: str = "") -> None:
    """Refuse a ``DIRECTORY_FLAGS`` flag given empty (an unset ``$VAR``): not the default it would be."""
    for name in DIRECTORY_FLAGS:
        if values[name].present and not values[name].value.strip():
            raise UserError(f"Invalid value for `--{name}`{where}. Received: {name}={values[name].value!r}. "
                            "Expected a directory path (or the flag left out, for its default).")


def _check_task_directories(values: flags.FlagValues, where: str) -> None:
    """Refuse a ``DIRECTORY_FLAGS`` flag that no task's host can make: empty, or under ``KERNEL_FILESYSTEMS``.

    The path is on the tasks' hosts, so it is read as written (``..`` resolved as a name), not looked up here.
    """
    _check_not_empty(values, where)
    for name in DIRECTORY_FLAGS:
        path = values[name].value
        if not values[name].present or not path.startswith("/"):
            continue
        plain = os.path.normpath(path)
        kernel = next((k for k in KERNEL_FILESYSTEMS if plain == k or plain.startswith(k + "/")), None)
        if kernel is not None:
            raise UserError(f"Invalid value for `--{name}`{where}: it lies in {kernel}, the kernel's own file system, "
                            f"where no directory can be made on any host. Received: {name}={path!r}. Expected a "
                            "directory that every task can make (existing or new).")


def main(argv: list[str], *, hooks: Sequence = ()) -> int:
    """``tfdist.train``'s absl main: the config from the flags (defaults -> ``--config`` file -> flags given), the
    run, and its last line. ``hooks``: engine hooks added to the run's task (the benchmark's hold)."""
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # TensorFlow's Python INFO lines are noise here
    only_flags(argv)
    values = flags.FLAGS
    _check_not_empty(values)
    weights_dir = resolve_dots(values.dump_weights) if values.dump_weights else None
    if weights_dir is not None:
        check_dump_weights(weights_dir)
    from tfdist.segmentation.experiment import run

    config = experiment_config.build_config(values.config, given_fields(values))
    summary = run(config, weights_dir=weights_dir, hooks=tuple(hooks))
    if "eval" in summary and not summary.get("is_chief", True):
        print(f"final eval: mean_iou {summary['eval']['mean_iou']:.4f} "
              f"(this worker writes nothing; the chief's outputs are in {summary['model_dir']})", flush=True)
    elif "eval" in summary:
        ev = summary["eval"]
        print(f"final eval: mean_iou {ev['mean_iou']:.4f}  pixel_accuracy {ev['pixel_accuracy']:.4f}  "
              f"loss {ev['loss']:.4f}  ({summary['images_per_second']:.1f} images/s, "
              f"{summary['wall_seconds']:.0f} s, outputs in {summary['model_dir']})", flush=True)
    return 0


def entry(hooks: Sequence = ()) -> None:
    """Run ``main`` as a command (``cli.run_main``: a user error is one line; a retired flag given, one note)."""
    run_main(functools.partial(main, hooks=hooks), define_flags, retired=config_lib.RETIRED)


def check_command(args: Sequence[str], *, strategy: str, where: str, replicas: int | None = None) -> None:
    """Refuse ``tfdist.train`` arguments that every task would fail on, or that contradict the deployment.

    Args:
      args: the arguments after ``--``.
      strategy: the deployment's ``--strategy`` ("" where it sets none).
      where: how the user gave them, for the message (``tfdist.manifest --form kubernetes``).
      replicas: the replicas the deployment makes (None: not known here); the global batch must split over them.

    Raises:
      UserError: an unknown flag or a bad value, a positional argument, a placement flag (``PLACEMENT_FLAGS``),
        a directory no task can make (``_check_task_directories``), a ``--strategy`` other than the deployment's,
        a config that ``tfdist.train`` refuses, or a global batch that does not split over ``replicas``.
    """
    received = f"Received: -- {' '.join(args)}"
    expected = f"Expected tfdist.train flags (python -m tfdist.train --helpfull) for every task of {where}."
    values = flags.FlagValues()
    define_flags(values)
    try:
        rest = values(["tfdist.train", *args])
    except (flags.Error, ValueError) as e:  # absl raises ValueError for a value given to a --noflag
        raise UserError(f"Invalid tfdist.train arguments after --: {e}. {received}. {expected}") from None
    if len(rest) > 1:
        raise UserError(f"Unexpected arguments after --: {' '.join(rest[1:])!r} is not a flag. {received}. "
                        f"{expected}")
    placed = [f"--{name}" for name in PLACEMENT_FLAGS if values[name].present]
    if placed:
        raise UserError(f"Unexpected `{placed[0]}` after --: {where} gives every task its own place in the cluster. "
                        f"{received}. Expected no {', '.join(placed)} after --.")
    if strategy and values["strategy"].present and values.strategy != strategy:
        raise UserError(f"Invalid `--strategy` after --: it contradicts the deployment's --strategy={strategy}. "
                        f"{received}. Expected --strategy {strategy} before --, and none after it.")
    _check_task_directories(values, " after --")
    given = given_fields(values)
    given.pop("encoder_weights", None)  # a file on the task's host
    if strategy:
        given["strategy"] = strategy
    config = _checked_config(values.config, given)
    if replicas is not None and (config is not None or "global_batch_size" in given):
        batch = config.train.global_batch_size if config is not None else given["global_batch_size"]
        strategies.check_global_batch(batch, replicas)


#: Fields whose checks read other fields (the dataset's classes and image size, the encoder's depth): with a
#: ``--config`` file that is only on the tasks' hosts, they are left to the task, which sees the whole config.
READ_WITH_OTHERS = ("dataset", "data_dir", "num_classes", "image_size", "depth", "encoder")


def _checked_config(experiment: str | None, given: dict) -> experiment_config.Config | None:
    """The config every task builds from ``--config`` and the ``given`` fields, checked as ``tfdist.train``
    checks it (but its ``encoder_weights``, a file on the tasks' hosts); None where ``--config`` is a file that
    is not here (read on the task's own host), each given field then checked alone on the defaults (but
    ``READ_WITH_OTHERS``)."""
    config = experiment_config.Config()
    if experiment is not None:
        try:
            config_lib.resolve_experiment_path(experiment)
        except UserError:
            if os.path.lexists(experiment):  # here, but a directory or a FIFO: not a file on the tasks' hosts either
                raise
            for name, value in given.items():
                if name not in READ_WITH_OTHERS:
                    experiment_config.validate(config_lib.override(config, {name: value}))
            return None
        config = config_lib.override(config_lib.load_experiment(config, experiment), {"encoder_weights": ""})
    return experiment_config.validate(config_lib.override(config, given))
