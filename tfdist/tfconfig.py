"""``python -m tfdist.tfconfig``: the TF_CONFIG of a task, the command of every task, or manifests."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Callable

from absl import flags

from tfdist import cluster, deploy, strategies
from tfdist.deploy import kubernetes
from tfdist.deploy.commands import task_commands
from tfdist.segmentation.command import check_command
from tfdist.cluster import sources
from tfdist.cluster.spec import ENVIRONMENT_CLUSTERS, KUBERNETES, SLURM
from tfdist.deploy import common, jobset, trainjob, volcano
from tfdist.errors import UserError, run_main

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none.

    (``tfdist.train`` defines ``--cluster`` and ``--task`` too; both modules can
    then be imported in one process, e.g. by tests or a launcher.)
    """
    flags.DEFINE_string(
        "cluster", None,
        "Cluster spec file (YAML or JSON), `slurm`: the cluster of this Slurm job step, or `kubernetes`: "
        "of this pod (docs/kubernetes.md).",
        flag_values=flag_values,
    )
    flags.DEFINE_string("task", None, "This task, as type:index, e.g. worker:1.", flag_values=flag_values)
    flags.DEFINE_bool("export_tf_config", False, "Print `export TF_CONFIG='...'` instead of the JSON.",
                      flag_values=flag_values)
    flags.DEFINE_bool(
        "commands",
        False,
        "Print the tfdist.train command of every task (or of --task only); arguments after -- are appended.",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "strategy", None, "Check that the cluster fits this strategy (and pass it to --commands and --emit).",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "slurm_tasks", "", "With --cluster slurm: the task types of the Slurm step, e.g. worker=2,ps=1 "
        "(default: every task a worker).", flag_values=flag_values,
    )
    flags.DEFINE_string(
        "emit", None, f"Print manifests instead of TF_CONFIG: one of {', '.join(EMITS)}; "
        "arguments after -- are appended to every task's tfdist.train command.", flag_values=flag_values,
    )
    flags.DEFINE_string("image", None, "--emit: the container image (with tfdist installed).", flag_values=flag_values)
    flags.DEFINE_string(
        "name", "tfdist", "--emit: the Service/TFJob name and the prefix of every task's host name.",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "namespace", "", "--emit: the namespace of every object (default: none written, kubectl's).",
        flag_values=flag_values,
    )
    flags.DEFINE_string("cpu", kubernetes.DEFAULT_CPU, "--emit: CPUs each task requests.", flag_values=flag_values)
    flags.DEFINE_string(
        "memory", kubernetes.DEFAULT_MEMORY, "--emit: memory each task requests (and is limited to).",
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "gpus", kubernetes.DEFAULT_GPUS, "--emit: GPUs (nvidia.com/gpu) of each task but ps.", flag_values=flag_values
    )
    flags.DEFINE_string(
        "volume", None, f"--emit {', '.join(deploy.FORMS)}: the PersistentVolumeClaim (shared by every pod) mounted "
        f"at {common.MODEL_MOUNT}, where --model_dir lies.", flag_values=flag_values,
    )
    flags.DEFINE_bool(
        "doctor", False, f"--emit {', '.join(deploy.FORMS)}: the same pods run tfdist.doctor (they meet and compare, "
        "and check --model_dir) instead of training; run it once before training.", flag_values=flag_values,
    )
    flags.DEFINE_string("output", None, "Write to this file instead of stdout.", flag_values=flag_values)


#: Renamed flags (old -> new): the old name still works, with a note (each flag has one meaning across the CLIs).
RENAMED = {"export": "export_tf_config"}

#: Flags that mean something only with --emit.
_EMIT_FLAGS = ("image", "name", "namespace", "cpu", "memory", "gpus", "volume", "doctor")

#: ``--emit`` values: the plain and legacy forms, then the gang-admitted ones.
EMITS = (*kubernetes.EMITS, *deploy.FORMS)


def _print_json(spec: cluster.ClusterSpec, tasks: list[cluster.Task], extra: list[str]) -> list[str]:
    return [task.tf_config_json() for task in tasks]


def _print_export(spec: cluster.ClusterSpec, tasks: list[cluster.Task], extra: list[str]) -> list[str]:
    return [f"export TF_CONFIG={shlex.quote(task.tf_config_json())}" for task in tasks]


def _print_commands(spec: cluster.ClusterSpec, tasks: list[cluster.Task], extra: list[str]) -> list[str]:
    wanted = {(task.type, task.index) for task in tasks}
    lines = []
    for task_type, index, command in task_commands(spec, FLAGS.cluster, extra):
        if (task_type, index) in wanted:
            host, _ = cluster.split_address(spec.address(task_type, index))
            lines += [f"# {task_type}:{index} on {host}", command]
    return lines


def _deployment(extra: list[str]) -> kubernetes.Deployment:
    """The ``kubernetes.Deployment`` the flags describe (``--image`` is required)."""
    if not FLAGS.image:
        raise UserError(
            f"Missing `--image` for --emit={FLAGS.emit}. Received: image={FLAGS.image!r}. "
            "Expected the container image to run, with tfdist installed, "
            "e.g. --image registry.example.com/tfdist:0.1.0."
        )
    return kubernetes.Deployment(
        image=FLAGS.image, strategy=FLAGS.strategy or "", train_args=tuple(extra), name=FLAGS.name,
        namespace=FLAGS.namespace, cpu=FLAGS.cpu, memory=FLAGS.memory, gpus=FLAGS.gpus,
    )


def _print_kubernetes(spec: cluster.ClusterSpec, tasks: list[cluster.Task], extra: list[str]) -> list[str]:
    """--emit kubernetes: the Service and the Jobs, as one YAML stream."""
    return [kubernetes.to_yaml(kubernetes.manifests(spec, _deployment(extra))).rstrip("\n")]


def _print_tfjob(spec: cluster.ClusterSpec, tasks: list[cluster.Task], extra: list[str]) -> list[str]:
    """--emit tfjob: the TFJob, as YAML."""
    return [kubernetes.to_yaml([kubernetes.tfjob(spec, _deployment(extra))]).rstrip("\n")]


def _volume() -> str:
    """``--volume``, required by the gang-admitted forms (every pod finds ``--model_dir`` there)."""
    if FLAGS.volume is None:
        raise UserError(
            f"Missing `--volume` for --emit={FLAGS.emit}. Received: volume=None. Expected the PersistentVolumeClaim "
            f"that holds --model_dir for every pod (mounted at {common.MODEL_MOUNT}), e.g. --volume unet-runs."
        )
    return FLAGS.volume


#: ``--emit`` gang-admitted form -> (spec, deployment, volume, doctor=) -> its documents.
_FORM_DOCUMENTS: dict[str, Callable[..., list[dict]]] = {
    "jobset": lambda *args, **kwargs: [jobset.jobset(*args, **kwargs)],
    "trainjob": trainjob.trainjob,  # the TrainingRuntime and the TrainJob
    "volcano": lambda *args, **kwargs: [volcano.volcano_job(*args, **kwargs)],
}


def _print_form(spec: cluster.ClusterSpec, tasks: list[cluster.Task], extra: list[str]) -> list[str]:
    """--emit jobset|trainjob|volcano: the form's documents, as one YAML stream."""
    documents = _FORM_DOCUMENTS[FLAGS.emit](spec, _deployment(extra), _volume(), doctor=FLAGS.doctor)
    return [kubernetes.to_yaml(documents).rstrip("\n")]


#: Output mode -> function (spec, tasks, extra args) -> lines to print.
_OUTPUTS: dict[str, Callable[[cluster.ClusterSpec, list[cluster.Task], list[str]], list[str]]] = {
    "json": _print_json,
    "export": _print_export,
    "commands": _print_commands,
    "kubernetes": _print_kubernetes,
    "tfjob": _print_tfjob,
    **dict.fromkeys(deploy.FORMS, _print_form),
}

#: Modes that print for every task of the cluster, and take arguments after --.
_ALL_TASK_MODES = ("commands", *EMITS)


def _output_mode() -> str:
    """The output mode the flags ask for; conflicting flags are a user error."""
    if FLAGS.emit is not None and FLAGS.emit not in EMITS:
        raise UserError("Invalid value for `--emit`. "
                        f"Received: emit={FLAGS.emit!r}. Expected one of: {', '.join(EMITS)}.")
    chosen = [name for name, given in (("--export_tf_config", FLAGS.export_tf_config), ("--commands", FLAGS.commands),
                                       ("--emit", FLAGS.emit is not None)) if given]
    if len(chosen) > 1:
        raise UserError(
            f"Conflicting flags `{chosen[0]}` and `{chosen[1]}`. "
            f"Received: {' and '.join(chosen)}. Expected at most one of them."
        )
    if FLAGS.emit is None:
        stray = [f"--{name}" for name in _EMIT_FLAGS if FLAGS[name].present]
        if stray:
            raise UserError(
                f"Unexpected `{stray[0]}` without --emit. Received: {', '.join(stray)}. "
                f"Expected --emit {' or --emit '.join(EMITS)} with it."
            )
    stray = [f"--{name}" for name in ("volume", "doctor") if FLAGS[name].present and FLAGS.emit in kubernetes.EMITS]
    if stray:
        raise UserError(
            f"Unexpected `{stray[0]}` with --emit={FLAGS.emit}. Received: {', '.join(stray)}. "
            f"Expected it with --emit {' or --emit '.join(deploy.FORMS)} only."
        )
    return FLAGS.emit or ("commands" if FLAGS.commands else "export" if FLAGS.export_tf_config else "json")


def _tasks(mode: str) -> tuple[cluster.ClusterSpec, list[cluster.Task]]:
    """The cluster and the tasks to print for ``mode``."""
    sources.check_flags(FLAGS.cluster, FLAGS.task, FLAGS.slurm_tasks)
    if FLAGS.cluster in ENVIRONMENT_CLUSTERS:
        if mode in _ALL_TASK_MODES:
            starter = "srun starts every task (see configs/slurm/train.sbatch)" if FLAGS.cluster == SLURM \
                else "the controller starts every pod"
            raise UserError(
                f"Invalid flags: --{'commands' if mode == 'commands' else 'emit'} with --cluster={FLAGS.cluster}. "
                f"Received: cluster={FLAGS.cluster!r}. Expected a cluster spec file: {starter} and each one prints "
                f"its own TF_CONFIG."
            )
        task = sources.resolve_task(FLAGS.cluster, None, slurm_tasks=FLAGS.slurm_tasks)
        return task.spec, [task]
    spec = cluster.load_cluster_spec(FLAGS.cluster)
    if FLAGS.task:
        if mode in EMITS:
            raise UserError(
                f"Unexpected `--task` with --emit={mode}. Received: task={FLAGS.task!r}. "
                f"Expected no --task: the manifests are for every task of the cluster."
            )
        return spec, [cluster.parse_task(FLAGS.task, spec)]
    if mode in _ALL_TASK_MODES:
        return spec, [cluster.Task(spec=spec, type=t, index=i) for t, i in spec.task_list()]
    raise UserError(
        f"Missing `--task` for --cluster={FLAGS.cluster}. Received: task={FLAGS.task!r}. "
        f"Expected type:index, one of: {', '.join(f'{t}:{i}' for t, i in spec.task_list())} (or --commands)."
    )


def _write(text: str) -> None:
    """Write ``text`` to ``--output``, or to stdout."""
    if not FLAGS.output:
        sys.stdout.write(text)
        return
    try:
        Path(FLAGS.output).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(
            f"Cannot write `--output`: {e.strerror or type(e).__name__}. Received: output={FLAGS.output!r}. "
            f"Expected a writable file path."
        ) from None


def main(argv: list[str]) -> int:
    """Print TF_CONFIG, per-task commands or manifests for ``--cluster``; see the module docstring."""
    extra = list(argv[1:])
    mode = _output_mode()
    if not FLAGS.cluster:
        raise UserError(
            f"Missing `--cluster`. Received: cluster={FLAGS.cluster!r}. "
            f"Expected a cluster spec file (YAML or JSON), e.g. --cluster configs/clusters/local_mwm.yaml, "
            f"or {SLURM} inside a Slurm job step, or {KUBERNETES} inside a pod (docs/kubernetes.md)."
        )
    if extra and mode not in _ALL_TASK_MODES:
        raise UserError(
            f"Unexpected arguments. Received: {' '.join(extra)!r}. "
            f"Expected flags only; arguments after -- are for --commands and --emit."
        )
    spec, tasks = _tasks(mode)
    if FLAGS.strategy is not None:
        strategies.check_strategy(spec, FLAGS.strategy)
    if mode in _ALL_TASK_MODES:
        # The strategy every task runs: --strategy, or (--emit) the manifests' default for the cluster.
        deployed = FLAGS.strategy or (kubernetes.default_strategy(spec) if mode != "commands" else "")
        check_command(extra, strategy=deployed, where=f"--{mode}" if mode == "commands" else f"--emit {mode}")
    if mode == "commands" and FLAGS.strategy is not None:
        extra = ["--strategy", FLAGS.strategy, *extra]
    _write("".join(line + "\n" for line in _OUTPUTS[mode](spec, tasks, extra)))
    return 0


def entry() -> None:
    """The ``tfdist-tfconfig`` console script."""
    run_main(main, define_flags, renamed=RENAMED)


if __name__ == "__main__":
    entry()
