"""One task of a cluster (``Task``): where a process stands, its two names, and the TF_CONFIG it hands TensorFlow."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any

from tfdist.cluster.spec import ClusterSpec, check_task, source_name
from tfdist.errors import UserError, short

_TASK_RE = re.compile(r"([^:\s]+):(-?[0-9]+)")

#: The name of a process that runs alone, outside any cluster (``Task.local``).
LOCAL = "local"

#: The cluster of ``Task.local``: one chief of its own. No cluster read from a file or the environment equals
#: it (their ports are 1..65535), so ``Task.is_local`` tells it apart.
_LOCAL_SPEC = ClusterSpec(tasks={"chief": ("localhost:0",)}, source=LOCAL)


def slug_of(name: str) -> str:
    """The file-name form of a task's name: ``"worker:1"`` -> ``"worker-1"`` (``"local"`` stays ``"local"``).

    Heartbeats, hold markers, weight dumps, scratch directories and tokens are named with it on disk.
    """
    return name.replace(":", "-")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """This process's task: ``spec``'s task ``type:index``.

    Attributes:
        spec: the whole cluster, evaluator included.
        type: the task type, one of ``spec.task_types``.
        index: the index within that type.

    ``str(task)`` is its ``name``.

    Raises:
        UserError: (when made) the task is not in ``spec``.
    """

    spec: ClusterSpec
    type: str
    index: int

    def __post_init__(self) -> None:
        check_task(self.spec, self.type, self.index)

    @classmethod
    def local(cls) -> Task:
        """A process that runs alone (no cluster, or an in-process one it coordinates): the one task of its own.

        It is named ``local``, leads (writes the outputs) and trains; it has no peers and no TF_CONFIG.
        """
        return cls(spec=_LOCAL_SPEC, type="chief", index=0)

    @property
    def is_local(self) -> bool:
        """Whether this is ``Task.local()``: a process alone, not a task of a cluster."""
        return self.spec == _LOCAL_SPEC

    @property
    def name(self) -> str:
        """``type:index`` (``local`` for ``Task.local()``), as ``--task`` takes it and as messages name the task."""
        return LOCAL if self.is_local else f"{self.type}:{self.index}"

    @property
    def slug(self) -> str:
        """The name as files on disk carry it: ``worker-1`` (``local``)."""
        return slug_of(self.name)

    def __str__(self) -> str:
        return self.name

    @property
    def address(self) -> str:
        """This task's ``host:port``."""
        return self.spec.tasks[self.type][self.index]

    @property
    def is_leader(self) -> bool:
        """Whether this task writes the run's outputs: chief 0 if there is a chief, else worker 0."""
        return self.spec.is_leader(self.type, self.index)

    @functools.cached_property
    def training_spec(self) -> ClusterSpec:
        """The cluster that trains together: ``spec`` without its evaluator (see ``ClusterSpec.training_spec``)."""
        return self.spec.training_spec()

    @property
    def leader(self) -> Task:
        """The task that leads the training cluster."""
        task_type, index = self.spec.leader()
        return Task(spec=self.training_spec, type=task_type, index=index)

    def training_tasks(self) -> list[Task]:
        """Every task of the training cluster, this one included, in ``task_list`` order."""
        return [Task(spec=self.training_spec, type=t, index=i) for t, i in self.training_spec.task_list()]

    def peers(self) -> list[Task]:
        """Every other task of the training cluster, in ``task_list`` order."""
        return [task for task in self.training_tasks() if (task.type, task.index) != (self.type, self.index)]

    def tf_config(self, *, training: bool = False) -> dict[str, Any]:
        """This task's TF_CONFIG: ``{"cluster": ..., "task": {"type": ..., "index": ...}}``.

        Args:
            training: give the training cluster (no evaluator), as the
                training tasks' TensorFlow must see it.
        """
        cluster = self.training_spec if training else self.spec
        return {"cluster": cluster.as_dict(), "task": {"type": self.type, "index": self.index}}

    def tf_config_json(self, *, training: bool = False) -> str:
        """``tf_config`` as compact JSON, the value to put in the TF_CONFIG variable."""
        return json.dumps(self.tf_config(training=training), separators=(",", ":"))


def parse_task(text: str, spec: ClusterSpec) -> Task:
    """Parse ``--task type:index`` into a ``Task`` of ``spec``.

    Args:
        text: e.g. ``"worker:1"``.
        spec: the cluster the task belongs to.

    Raises:
        UserError: ``text`` is not ``type:index`` with a non-negative integer
            index, or the task is not in ``spec``.
    """
    match = _TASK_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None or match.group(2).startswith("-"):
        raise UserError(
            f"Invalid value for `--task`. Received: task={short(text)}. "
            f"Expected type:index with a non-negative integer index, e.g. worker:0 "
            f"(tasks of {source_name(spec.source)}: {', '.join(f'{t}:{i}' for t, i in spec.task_list())})."
        )
    task_type, index = match.group(1), int(match.group(2))
    check_task(spec, task_type, index, what="value for `--task`")
    return Task(spec=spec, type=task_type, index=index)
