"""``python -m tfdist.tfconfig``: the TF_CONFIG of a task, or the command of every task.

    # TF_CONFIG of one task, as compact JSON
    python -m tfdist.tfconfig --cluster configs/clusters/example.yaml --task worker:1
    # the same as a shell line:  eval "$(python -m tfdist.tfconfig ... --export)"
    python -m tfdist.tfconfig --cluster FILE --task worker:1 --export
    # for every task, "# type:i on host" and the command to run on that host;
    # arguments after -- are passed to every tfdist.train command
    python -m tfdist.tfconfig --cluster FILE --commands --strategy parameter_server -- --epochs 2

``--strategy`` checks that the cluster has the tasks the strategy needs (and
with ``--commands`` is passed on to every command). Every user error ends with
exit status 2 and one line on stderr. TensorFlow is never imported.
"""

from __future__ import annotations

import shlex
import sys
from typing import Callable

from absl import flags

from tfdist import cluster
from tfdist.errors import UserError, run_main

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none.

    (``tfdist.train`` defines ``--cluster`` and ``--task`` too; both modules can
    then be imported in one process, e.g. by tests or a launcher.)
    """
    flags.DEFINE_string("cluster", None, "Cluster spec file (YAML or JSON).", flag_values=flag_values)
    flags.DEFINE_string("task", None, "This task, as type:index, e.g. worker:1.", flag_values=flag_values)
    flags.DEFINE_bool("export", False, "Print `export TF_CONFIG='...'` instead of the JSON.", flag_values=flag_values)
    flags.DEFINE_bool(
        "commands",
        False,
        "Print the tfdist.train command of every task (or of --task only); arguments after -- are appended.",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "strategy", None, "Check that the cluster fits this strategy (and pass it to --commands).", flag_values=flag_values
    )
    # Room for later: --emit kubernetes (manifests instead of shell lines) is
    # one more entry in _OUTPUTS below, chosen in _output_mode.


def _print_json(spec: cluster.ClusterSpec, tasks: list[tuple[str, int]], extra: list[str]) -> list[str]:
    return [cluster.tf_config_json(spec, t, i) for t, i in tasks]


def _print_export(spec: cluster.ClusterSpec, tasks: list[tuple[str, int]], extra: list[str]) -> list[str]:
    return [f"export TF_CONFIG={shlex.quote(cluster.tf_config_json(spec, t, i))}" for t, i in tasks]


def _print_commands(spec: cluster.ClusterSpec, tasks: list[tuple[str, int]], extra: list[str]) -> list[str]:
    wanted = set(tasks)
    lines = []
    for task_type, index, command in cluster.task_commands(spec, FLAGS.cluster, extra):
        if (task_type, index) in wanted:
            host, _ = cluster.split_address(spec.address(task_type, index))
            lines += [f"# {task_type}:{index} on {host}", command]
    return lines


#: Output mode -> function (spec, tasks, extra args) -> lines to print.
_OUTPUTS: dict[str, Callable[[cluster.ClusterSpec, list[tuple[str, int]], list[str]], list[str]]] = {
    "json": _print_json,
    "export": _print_export,
    "commands": _print_commands,
}


def _output_mode() -> str:
    if FLAGS.export and FLAGS.commands:
        raise UserError(
            "Conflicting flags `--export` and `--commands`. Received: both. Expected at most one of them."
        )
    return "commands" if FLAGS.commands else "export" if FLAGS.export else "json"


def main(argv: list[str]) -> int:
    """Print TF_CONFIG or per-task commands for ``--cluster``; see the module docstring."""
    extra = list(argv[1:])
    mode = _output_mode()
    if not FLAGS.cluster:
        raise UserError(
            f"Missing `--cluster`. Received: cluster={FLAGS.cluster!r}. "
            f"Expected a cluster spec file (YAML or JSON), e.g. --cluster configs/clusters/local_mwm.yaml."
        )
    if extra and mode != "commands":
        raise UserError(
            f"Unexpected arguments. Received: {' '.join(extra)!r}. "
            f"Expected flags only; arguments after -- are for --commands."
        )
    spec = cluster.load_cluster_spec(FLAGS.cluster)
    if FLAGS.strategy is not None:
        cluster.check_strategy(spec, FLAGS.strategy)
    if FLAGS.task:
        tasks = [cluster.parse_task(FLAGS.task, spec)]
    elif mode == "commands":
        tasks = spec.task_list()
    else:
        raise UserError(
            f"Missing `--task` for --cluster={FLAGS.cluster}. Received: task={FLAGS.task!r}. "
            f"Expected type:index, one of: {', '.join(f'{t}:{i}' for t, i in spec.task_list())} (or --commands)."
        )
    if mode == "commands" and FLAGS.strategy is not None:
        extra = ["--strategy", FLAGS.strategy, *extra]
    sys.stdout.write("".join(line + "\n" for line in _OUTPUTS[mode](spec, tasks, extra)))
    return 0


def entry() -> None:
    """The ``tfdist-tfconfig`` console script."""
    define_flags()
    run_main(main)


if __name__ == "__main__":
    entry()
