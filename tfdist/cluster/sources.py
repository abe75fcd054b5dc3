"""Where this process's task comes from: ``--cluster FILE --task T``, TF_CONFIG, a Slurm job step, or a pod."""

from __future__ import annotations

import json
import os
from typing import Mapping

from tfdist.cluster import kubernetes
from tfdist.cluster.slurm import parse_slurm_tasks
from tfdist.cluster.slurm import resolve as resolve_slurm
from tfdist.cluster.address import is_digits
from tfdist.cluster.files import json_unique_object, load_cluster_spec
from tfdist.cluster.spec import ENVIRONMENT_CLUSTERS, KUBERNETES, SLURM, TF_CONFIG, check_task, parse_cluster_spec
from tfdist.cluster.task import Task, parse_task
from tfdist.errors import UserError, article, short


def check_flags(cluster_value: str | None, task: str | None, slurm_tasks: str | None) -> None:
    """Check that ``--task`` and ``--slurm_tasks`` fit ``--cluster``; one place for both CLIs and the config.

    With ``--cluster slurm`` each task finds its own place in the allocation,
    so ``--task`` would contradict it; ``--slurm_tasks`` means nothing without
    ``--cluster slurm``.

    Raises:
        UserError: ``--task`` with ``--cluster slurm``, ``--slurm_tasks``
            without it, or a malformed ``--slurm_tasks``.
    """
    if cluster_value in ENVIRONMENT_CLUSTERS and task:
        where = "Slurm task takes its own from the allocation (its node and SLURM_LOCALID)" if cluster_value == SLURM \
            else "pod takes its own from its environment (its Job's completion index and host name)"
        raise UserError(
            f"Unexpected `--task` with --cluster={cluster_value}. Received: task={task!r}. "
            f"Expected no --task: each {where}."
        )
    if cluster_value == SLURM:
        parse_slurm_tasks(slurm_tasks or "")
    elif slurm_tasks:
        raise UserError(
            f"Unexpected `--slurm_tasks` without --cluster={SLURM}. Received: slurm_tasks={slurm_tasks!r}, "
            f"cluster={cluster_value!r}. Expected --cluster={SLURM} with it, or no --slurm_tasks."
        )


def from_environment(environ: Mapping[str, str] | None = None) -> Task | None:
    """Read and validate a TF_CONFIG that is already set (by a launcher, Kubernetes...).

    TensorFlow would accept a malformed TF_CONFIG and fail later, on another
    host; this checks it as strictly as a cluster spec file.

    Args:
        environ: the environment to read; ``os.environ`` when None.

    Returns:
        This process's ``Task``, or None when TF_CONFIG is unset, blank
        or an empty JSON object (TensorFlow's "no cluster" too).

    Raises:
        UserError: TF_CONFIG is not JSON, not an object, lacks ``"cluster"``
            or ``"task"``, its cluster fails ``parse_cluster_spec``, or its
            task is not a task of that cluster. The index may be an integer or
            a string of digits, as TensorFlow's resolver allows.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG", "")
    if not raw.strip():
        return None
    expected = 'Expected a JSON object {"cluster": {...}, "task": {"type": ..., "index": ...}}.'
    try:
        obj = json.loads(raw, object_pairs_hook=json_unique_object)
    except ValueError as e:
        problem = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise UserError(
            f"Invalid TF_CONFIG environment variable: not valid JSON ({problem}). "
            f"Received: TF_CONFIG={short(raw)}. {expected}"
        ) from None
    if isinstance(obj, dict) and not obj:
        return None
    if not isinstance(obj, dict):
        raise UserError(
            f"Invalid TF_CONFIG environment variable: {article(type(obj).__name__)}, not a JSON object. "
            f"Received: TF_CONFIG={short(raw)}. {expected}"
        )
    for key in ("cluster", "task"):
        if key not in obj:
            raise UserError(
                f'Invalid TF_CONFIG environment variable: no "{key}" key. '
                f"Received: TF_CONFIG={short(raw)}. {expected}"
            )
    spec = parse_cluster_spec(obj["cluster"], source=TF_CONFIG)
    task = obj["task"]
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise UserError(
            f'Invalid "task" in TF_CONFIG. Received: task={short(task)}. '
            f'Expected {{"type": one of {", ".join(spec.tasks)}, "index": an integer}}.'
        )
    task_type, index = task["type"], task["index"]
    if isinstance(index, str) and is_digits(index):
        index = int(index)
    if not isinstance(task_type, str) or isinstance(index, bool) or not isinstance(index, int):
        raise UserError(
            f'Invalid "task" in TF_CONFIG. Received: task={short(task)}. '
            f'Expected {{"type": one of {", ".join(spec.tasks)}, "index": a non-negative integer}}.'
        )
    check_task(spec, task_type, index, what='"task" in TF_CONFIG')
    return Task(spec=spec, type=task_type, index=index)


def resolve_task(
    cluster_file: str | None,
    task: str | None,
    environ: Mapping[str, str] | None = None,
    *,
    slurm_tasks: str = "",
) -> Task | None:
    """The cluster and this process's task: from ``--cluster/--task``, else TF_CONFIG, else None.

    Flags win over the environment, as everywhere in tfdist. ``--cluster
    slurm`` takes the cluster and the task from the Slurm job step instead of
    a file (``cluster.slurm.resolve``, which imports TensorFlow); nothing else
    here does.

    Args:
        cluster_file: ``--cluster`` (empty or None when not given), or
            ``"slurm"``, or ``"kubernetes"`` (``cluster.kubernetes.resolve``;
            chosen too when neither flags nor TF_CONFIG are given and
            ``TFDIST_TASKS`` is set).
        task: ``--task`` (empty or None when not given; must be empty with
            ``--cluster slurm``).
        environ: the environment to read TF_CONFIG (or the ``SLURM_*``
            variables) from; ``os.environ`` when None.
        slurm_tasks: ``--slurm_tasks``, the task types of a Slurm step, e.g.
            ``"worker=2,ps=1"``; empty: every task a worker. Only with
            ``--cluster slurm``.

    Returns:
        This process's ``Task``, or None when neither flags nor TF_CONFIG
        describe a cluster (a single-process run).

    Raises:
        UserError: only one of ``cluster_file`` and ``task`` is given, or
            either fails ``load_cluster_spec``/``parse_task``, or TF_CONFIG
            fails ``from_environment``; with ``--cluster slurm``: a ``--task``,
            or a step that ``cluster.slurm.resolve`` refuses; without it: a
            ``--slurm_tasks``.
    """
    check_flags(cluster_file, task, slurm_tasks)
    if cluster_file == SLURM:
        return resolve_slurm(slurm_tasks, environ)
    if cluster_file == KUBERNETES:
        return kubernetes.resolve(environ)
    if cluster_file and not task:
        spec = load_cluster_spec(cluster_file)
        raise UserError(
            f"Missing `--task` for --cluster={cluster_file}. Received: task={task!r}. "
            f"Expected type:index, one of: {', '.join(f'{t}:{i}' for t, i in spec.task_list())}."
        )
    if task and not cluster_file:
        raise UserError(
            f"Missing `--cluster` for --task={task}. Received: cluster={cluster_file!r}. "
            f"Expected a cluster spec file (YAML or JSON)."
        )
    if cluster_file:
        return parse_task(task, load_cluster_spec(cluster_file))
    environ_or_os = os.environ if environ is None else environ
    if kubernetes.detected(environ_or_os):
        if environ_or_os.get("TF_CONFIG", "").strip():
            raise UserError(
                f"Ambiguous task: both TF_CONFIG and {kubernetes.TASKS_ENV} are set. "
                f"Received: {kubernetes.TASKS_ENV}={short(environ_or_os[kubernetes.TASKS_ENV])}. "
                f"Expected one of them: TF_CONFIG, or the job's shape for --cluster={KUBERNETES}."
            )
        return kubernetes.resolve(environ)
    return from_environment(environ)


def cluster_task_types(cluster_file: str | None, task: str | None, environ: Mapping[str, str] | None = None, *,
                       slurm_tasks: str = "") -> frozenset[str] | None:
    """The task types of the cluster this process is in (``resolve_task``'s), or None without one: what
    ``--strategy auto`` chooses by. A cluster the environment describes is read from the flags where the
    environment is not there yet (a launcher checking a command): ``--cluster slurm`` from ``--slurm_tasks``
    (every task a worker when empty), ``--cluster kubernetes`` outside a pod as workers.

    Raises:
        UserError: as ``resolve_task`` does, for a cluster file or TF_CONFIG.
    """
    environ_or_os = os.environ if environ is None else environ
    if cluster_file == SLURM:
        return frozenset(parse_slurm_tasks(slurm_tasks) or ("worker",))
    if cluster_file == KUBERNETES and not kubernetes.detected(environ_or_os):
        return frozenset(("worker",))
    found = resolve_task(cluster_file, task, environ_or_os, slurm_tasks=slurm_tasks)
    return None if found is None else frozenset(found.spec.tasks)
