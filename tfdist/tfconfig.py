"""``python -m tfdist.tfconfig``: the TF_CONFIG of a task, or the command of every task (manifests:
``tfdist.manifest``)."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Callable

from absl import flags

from tfdist import cluster, strategies
from tfdist.cluster import sources
from tfdist.cluster.spec import ENVIRONMENT_CLUSTERS, KUBERNETES, SLURM
from tfdist.deploy.commands import task_commands
from tfdist.deploy.output import write_output
from tfdist.cli import NOTE_ENV, rename_flags, run_main
from tfdist.errors import UserError
from tfdist.segmentation.command import check_command

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
        "strategy", None, "Check that the cluster fits this strategy (and pass it to --commands).",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "slurm_tasks", "", "With --cluster slurm: the task types of the Slurm step, e.g. worker=2,ps=1 "
        "(default: every task a worker).", flag_values=flag_values,
    )
    flags.DEFINE_string("output", None, "Write to this file instead of stdout.", flag_values=flag_values)


#: Renamed flags (old -> new): the old name still works, with a note (each flag has one meaning across the CLIs).
RENAMED = {"export": "export_tf_config"}

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


#: Output mode -> function (spec, tasks, extra args) -> lines to print.
_OUTPUTS: dict[str, Callable[[cluster.ClusterSpec, list[cluster.Task], list[str]], list[str]]] = {
    "json": _print_json,
    "export": _print_export,
    "commands": _print_commands,
}



def _output_mode() -> str:
    """The output mode the flags ask for; conflicting flags are a user error."""
    if FLAGS.export_tf_config and FLAGS.commands:
        raise UserError("Conflicting flags `--export_tf_config` and `--commands`. "
                        "Received: --export_tf_config and --commands. Expected at most one of them.")
    return "commands" if FLAGS.commands else "export" if FLAGS.export_tf_config else "json"


def _tasks(mode: str) -> tuple[cluster.ClusterSpec, list[cluster.Task]]:
    """The cluster and the tasks to print for ``mode``."""
    sources.check_flags(FLAGS.cluster, FLAGS.task, FLAGS.slurm_tasks)
    if FLAGS.cluster in ENVIRONMENT_CLUSTERS:
        if mode == "commands":
            starter = "srun starts every task (see configs/slurm/train.sbatch)" if FLAGS.cluster == SLURM \
                else "the controller starts every pod"
            raise UserError(
                f"Invalid flags: --commands with --cluster={FLAGS.cluster}. "
                f"Received: cluster={FLAGS.cluster!r}. Expected a cluster spec file: {starter} and each one prints "
                f"its own TF_CONFIG."
            )
        task = sources.resolve_task(FLAGS.cluster, None, slurm_tasks=FLAGS.slurm_tasks)
        return task.spec, [task]
    spec = cluster.load_cluster_spec(FLAGS.cluster)
    if FLAGS.task:
        return spec, [cluster.parse_task(FLAGS.task, spec)]
    if mode == "commands":
        return spec, [cluster.Task(spec=spec, type=t, index=i) for t, i in spec.task_list()]
    raise UserError(
        f"Missing `--task` for --cluster={FLAGS.cluster}. Received: task={FLAGS.task!r}. "
        f"Expected type:index, one of: {', '.join(f'{t}:{i}' for t, i in spec.task_list())} (or --commands)."
    )


def main(argv: list[str]) -> int:
    """Print TF_CONFIG or per-task commands for ``--cluster``; see the module docstring."""
    extra = list(argv[1:])
    mode = _output_mode()
    if not FLAGS.cluster:
        raise UserError(
            f"Missing `--cluster`. Received: cluster={FLAGS.cluster!r}. "
            f"Expected a cluster spec file (YAML or JSON), e.g. --cluster configs/clusters/local_mwm.yaml, "
            f"or {SLURM} inside a Slurm job step, or {KUBERNETES} inside a pod (docs/kubernetes.md)."
        )
    if extra and mode != "commands":
        raise UserError(
            f"Unexpected arguments. Received: {' '.join(extra)!r}. "
            f"Expected flags only; arguments after -- are for --commands."
        )
    spec, tasks = _tasks(mode)
    if FLAGS.strategy is not None:
        strategies.check_strategy(spec, FLAGS.strategy)
    if mode == "commands":
        # Each host's GPUs multiply the replicas; a global batch that does not split over the tasks fits none.
        strategy = FLAGS.strategy or strategies.auto_strategy(frozenset(spec.tasks), local_devices=1)
        check_command(extra, strategy=FLAGS.strategy or "", where="--commands",
                      replicas=strategies.cluster_replicas(strategy, spec, gpus=0))
        if FLAGS.strategy is not None:
            extra = ["--strategy", FLAGS.strategy, *extra]
    write_output("".join(line + "\n" for line in _OUTPUTS[mode](spec, tasks, extra)), FLAGS.output)
    return 0


def _emits(argv: list[str]) -> bool:
    """Whether ``argv`` asks for manifests the old way (``--emit FORM`` before ``--``)."""
    flags_part = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    return any(arg in ("--emit", "-emit") or arg.startswith(("--emit=", "-emit=")) for arg in flags_part)


def entry() -> None:
    """The ``tfdist-tfconfig`` console script; ``--emit FORM`` (manifests) still works as ``tfdist.manifest
    --form FORM``, with a note."""
    if _emits(sys.argv):  # the manifests' own command, in this process's place
        argv, _ = rename_flags(sys.argv, {"emit": "form"})
        os.environ[NOTE_ENV] = ("tfdist.tfconfig --emit is deprecated; use python -m tfdist.manifest --form "
                                "(the same manifests)")
        os.execv(sys.executable, [sys.executable, "-m", "tfdist.manifest", *argv[1:]])
    run_main(main, define_flags, renamed=RENAMED)


if __name__ == "__main__":
    entry()
