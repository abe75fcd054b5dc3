"""The shell command that starts each task of a cluster on its host (``tfconfig --commands``)."""

from __future__ import annotations

import shlex
from typing import Sequence

from tfdist.cluster.spec import ClusterSpec


def task_commands(
    spec: ClusterSpec,
    cluster_file: str,
    extra_args: Sequence[str] = (),
    *,
    python: str = "python",
    module: str = "tfdist.train",
) -> list[tuple[str, int, str]]:
    """The shell command that starts each task of the cluster on its host.

    Every host runs the same command but for ``--task``; the cluster file
    path is used as given, so it must be valid on every host (e.g. relative
    to a checkout at the same place).

    Args:
        spec: the cluster.
        cluster_file: the path passed as ``--cluster``.
        extra_args: arguments appended to every command (e.g. training flags).
        python: the interpreter to run on the hosts.
        module: the module run with ``python -m``.

    Returns:
        ``(task_type, index, command)`` for every task in ``task_list`` order;
        each command is one shell-quoted line.
    """
    commands = []
    for task_type, index in spec.task_list():
        argv = [python, "-m", module, "--cluster", cluster_file, "--task", f"{task_type}:{index}", *extra_args]
        commands.append((task_type, index, shlex.join(argv)))
    return commands
