"""The cluster of a pod of an Indexed Job or a JobSet (``--cluster kubernetes``), from its environment."""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Mapping

from tfdist.cluster.address import is_digits
from tfdist.cluster.spec import KUBERNETES, MAX_TASKS, TASK_TYPES, parse_cluster_spec
from tfdist.cluster.task import Task
from tfdist.errors import UserError, short

TASKS_ENV = "TFDIST_TASKS"  #: the job's shape, a JSON object of task type -> count, e.g. {"worker": 2, "ps": 1}
PORT_ENV = "TFDIST_PORT"  #: the port every task listens on (each pod has its own address)
TASK_TYPE_ENV = "TFDIST_TASK_TYPE"  #: this pod's task type (a JobSet's replicated-job name, by the downward API)
JOB_INDEX_ENV = "TFDIST_JOB_INDEX"  #: a JobSet's job index (label jobset.sigs.k8s.io/job-index); unset: a plain Job
SUBDOMAIN_ENV = "TFDIST_SUBDOMAIN"  #: the pods' subdomain (the headless Service); unset: the run's name
INDEX_ENV = "JOB_COMPLETION_INDEX"  #: set by the Job controller in every pod of an Indexed Job
HOSTNAME_ENV = "HOSTNAME"  #: the pod's host name, set in every container

#: The port when ``TFDIST_PORT`` is unset (TensorFlow's usual one, and Volcano's).
DEFAULT_PORT = 2222


def detected(environ: Mapping[str, str]) -> bool:
    """Whether the environment describes a pod of this source: ``TFDIST_TASKS`` is set."""
    return bool(environ.get(TASKS_ENV, "").strip())


def _error(name: str, value: Any, problem: str, expected: str) -> UserError:
    return UserError(
        f"Invalid pod environment for --cluster={KUBERNETES}: {problem}. "
        f"Received: {name}={short(value)}. Expected {expected}."
    )


def _shape(environ: Mapping[str, str]) -> dict[str, int]:
    """``TFDIST_TASKS``: task type -> count."""
    raw = environ.get(TASKS_ENV, "")
    expected = f'a JSON object of task type ({", ".join(TASK_TYPES)}) -> count >= 1, e.g. {{"worker": 2, "ps": 1}}'
    if not raw.strip():
        raise _error(TASKS_ENV, raw, "the job's shape is not set", expected)
    try:
        shape = json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise _error(TASKS_ENV, raw, f"the task type {e.args[0]!r} is given twice", expected) from None
    except ValueError:
        raise _error(TASKS_ENV, raw, "not JSON", expected) from None
    if not isinstance(shape, dict) or not shape or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape.values()
    ):
        raise _error(TASKS_ENV, raw, "not a mapping of task type to count", expected)
    if sum(shape.values()) > MAX_TASKS:
        raise _error(TASKS_ENV, raw, f"more than {MAX_TASKS} tasks", expected)
    return shape


class _DuplicateKey(Exception):
    """A key given twice in one JSON object (TF_CONFIG's own parser refuses it too)."""


def _unique_keys(pairs: list) -> dict:
    """``json.loads``' ``object_pairs_hook``: the object as a dict, refusing a key given twice."""
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def _integer(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None and default is not None:
        return default
    if raw is None or not is_digits(raw):
        what = f"{name} is not set" if raw is None else f"{name} is not a non-negative integer"
        if raw is None and name == INDEX_ENV:
            what += " (is the pod's Job an Indexed Job, completionMode: Indexed?)"
        raise _error(name, raw, what, "a non-negative integer, as the controller sets it")
    return int(raw)


def resolve(environ: Mapping[str, str] | None = None) -> Task:
    """This pod's ``Task`` and the whole cluster, from its environment.

    Args:
        environ: the environment; ``os.environ`` when None (then a missing
            ``HOSTNAME`` is the system's host name).

    Returns:
        The task, its cluster's source ``"kubernetes"``.

    Raises:
        UserError: a variable is missing or malformed, the task type is not one
            of the shape, the index is out of range, a JobSet job index is not
            0 (one Job per task type), or the host name is not the Job's
            ``...-<type>[-<job index>]-<index>`` (a mismatched shape or name).
    """
    from_os = environ is None
    environ = os.environ if environ is None else environ
    shape = _shape(environ)
    port = _integer(environ, PORT_ENV, DEFAULT_PORT)
    if not 1 <= port <= 65535:
        raise _error(PORT_ENV, environ.get(PORT_ENV), "not a port", "a port in 1..65535")
    task_type = environ.get(TASK_TYPE_ENV, "")
    if task_type not in shape:
        raise _error(TASK_TYPE_ENV, task_type, f"not a task type of {TASKS_ENV}={environ[TASKS_ENV]}",
                     f"one of: {', '.join(shape)}")
    index = _integer(environ, INDEX_ENV)
    if index >= shape[task_type]:
        raise _error(INDEX_ENV, str(index), f"out of range for {shape[task_type]} `{task_type}` task(s) in {TASKS_ENV}",
                     f"an index in 0..{shape[task_type] - 1}")
    jobset = JOB_INDEX_ENV in environ
    if jobset and _integer(environ, JOB_INDEX_ENV) != 0:
        raise _error(JOB_INDEX_ENV, environ[JOB_INDEX_ENV], "a replicated job of more than one Job",
                     "0: one Job of every task type, its pods the tasks (replicas: 1)")
    hostname = environ.get(HOSTNAME_ENV) or (socket.gethostname() if from_os else "")
    middle = "-0" if jobset else ""  # a JobSet's one Job of each task type has job index 0
    suffix = f"-{task_type}{middle}-{index}"
    name = hostname[: -len(suffix)] if hostname.endswith(suffix) else ""
    if not name:
        raise _error(HOSTNAME_ENV, hostname, f"not the host name of {task_type}:{index} of an Indexed Job",
                     f"<name>{suffix}, as the controller names the pod")
    subdomain = environ.get(SUBDOMAIN_ENV) or name
    cluster = {
        t: [f"{name}-{t}{middle}-{i}.{subdomain}:{port}" for i in range(count)] for t, count in shape.items()
    }
    return Task(spec=parse_cluster_spec(cluster, source=KUBERNETES), type=task_type, index=index)
