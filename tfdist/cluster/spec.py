"""A cluster: every task's ``host:port`` by task type, validated (``ClusterSpec``)."""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Mapping

from tfdist.cluster.address import address_identity, parse_address
from tfdist.errors import UserError, article, short

#: The task types of TF_CONFIG, in the order tfdist lists them everywhere.
TASK_TYPES = ("chief", "worker", "ps", "evaluator")

#: More tasks of one job than any cluster has: a count above it is a typo, refused before a list of it is built.
MAX_TASKS = 1 << 16

#: Task types that may have at most one task.
SINGLE_TASK_TYPES = ("chief", "evaluator")

#: The source name of a cluster read from the environment.
TF_CONFIG = "TF_CONFIG"

#: The ``--cluster`` value (and source name) of a cluster taken from a Slurm allocation (``cluster.slurm``).
SLURM = "slurm"

#: The ``--cluster`` value (and source name) of a cluster taken from a pod's environment (``cluster.kubernetes``).
KUBERNETES = "kubernetes"

#: ``--cluster`` values that name a source in the environment, not a file; each task finds its own task there.
ENVIRONMENT_CLUSTERS = (SLURM, KUBERNETES)


def source_name(source: str) -> str:
    """How errors name a cluster's source: ``cluster spec FILE``, ``TF_CONFIG "cluster"``, the Slurm allocation."""
    if source == TF_CONFIG:
        return 'TF_CONFIG "cluster"'
    if source == KUBERNETES:
        return "the pod's environment"
    return "the Slurm allocation" if source == SLURM else f"cluster spec {source}"


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A validated cluster: every task's address, by task type and index.

    Build one with ``parse_cluster_spec``, ``load_cluster_spec`` or
    ``from_environment``, which validate; the constructor only orders the
    types, makes the addresses tuples and refuses an unknown task type.

    Attributes:
        tasks: task type -> addresses, ordered chief, worker, ps, evaluator,
            holding only the types present. Read-only.
        source: where the cluster came from (a file name, or ``"TF_CONFIG"``),
            named in every error about it.
    """

    tasks: Mapping[str, tuple[str, ...]]
    source: str = "<cluster>"

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in TASK_TYPES]
        if unknown:
            raise UserError(
                f"Unknown task type in {source_name(self.source)}. Received: {short(unknown[0])}. "
                f"Expected one of: {', '.join(TASK_TYPES)}."
            )
        ordered = {t: tuple(self.tasks[t]) for t in TASK_TYPES if t in self.tasks}
        object.__setattr__(self, "tasks", types.MappingProxyType(ordered))

    def __hash__(self) -> int:
        return hash((tuple(self.tasks.items()), self.source))

    def as_dict(self) -> dict[str, list[str]]:
        """The cluster in TF_CONFIG's ``"cluster"`` form: type -> list of addresses."""
        return {t: list(addresses) for t, addresses in self.tasks.items()}

    def task_list(self) -> list[tuple[str, int]]:
        """Every task as ``(type, index)``, chief first, then workers, ps, evaluator."""
        return [(t, i) for t, addresses in self.tasks.items() for i in range(len(addresses))]

    @property
    def num_tasks(self) -> int:
        """How many tasks (processes) the cluster has, of every type."""
        return sum(len(addresses) for addresses in self.tasks.values())

    @property
    def task_types(self) -> tuple[str, ...]:
        """The task types present, in ``TASK_TYPES`` order."""
        return tuple(self.tasks)

    def count(self, task_type: str) -> int:
        """How many tasks of ``task_type`` there are (0 when the type is absent)."""
        return len(self.tasks.get(task_type, ()))

    def addresses(self) -> list[str]:
        """Every task's ``host:port``, in ``task_list`` order."""
        return [a for addresses in self.tasks.values() for a in addresses]

    def address(self, task_type: str, index: int) -> str:
        """The ``host:port`` of one task.

        Raises:
            UserError: the task is not in the cluster.
        """
        check_task(self, task_type, index)
        return self.tasks[task_type][index]

    def leader(self) -> tuple[str, int]:
        """The task that writes the run's outputs: chief 0 if present, else worker 0."""
        return ("chief", 0) if "chief" in self.tasks else ("worker", 0)

    def is_leader(self, task_type: str, index: int) -> bool:
        """Whether ``(task_type, index)`` is ``leader()``."""
        return (task_type, index) == self.leader()

    def training_spec(self) -> ClusterSpec:
        """The cluster without its evaluator: the tasks that train (or serve) together.

        The evaluator is a side-car: ``MultiWorkerMirroredStrategy`` would give
        it a cluster of its own and ``ParameterServerStrategy``'s coordinator
        connects to every task it is told of, so training tasks never see it.
        """
        if "evaluator" not in self.tasks:
            return self
        return ClusterSpec(tasks={t: a for t, a in self.tasks.items() if t != "evaluator"}, source=self.source)


def parse_cluster_spec(obj: Any, *, source: str) -> ClusterSpec:
    """Validate an already-loaded cluster (from YAML, JSON or TF_CONFIG).

    Args:
        obj: a mapping of task type -> list of ``host:port`` (or one string).
        source: where ``obj`` came from, named in every error (a file name, or
            ``"TF_CONFIG"``).

    Returns:
        The validated ``ClusterSpec``, ordered chief, worker, ps, evaluator.

    Raises:
        UserError: ``obj`` is empty or not a mapping; a task type is unknown;
            a type's value is not a non-empty list of ``host:port`` strings; an
            address is malformed (no port, a port outside 1..65535, an empty
            host, whitespace, an IPv6 host without brackets); an address is
            used twice; there is more than one chief or evaluator; or there is
            no worker.
    """
    where = source_name(source)
    if obj is None or (isinstance(obj, Mapping) and not obj):
        raise UserError(
            f"Empty {where}. Received: {short(obj)}. "
            f"Expected task types ({', '.join(TASK_TYPES)}) as keys, each a list of host:port."
        )
    if not isinstance(obj, Mapping):
        raise UserError(
            f"Invalid {where}: {'its value' if source == TF_CONFIG else 'the top level'} "
            f"is {article(type(obj).__name__)}. Received: {short(obj)}. "
            f"Expected a mapping of task type ({', '.join(TASK_TYPES)}) -> list of host:port."
        )
    tasks: dict[str, tuple[str, ...]] = {}
    seen: dict[tuple[str, int], tuple[str, Any]] = {}
    for task_type, value in obj.items():
        if task_type not in TASK_TYPES:
            raise UserError(
                f"Unknown task type in {where}. Received: {short(task_type)}. Expected one of: {', '.join(TASK_TYPES)}."
            )
        if isinstance(value, str):
            entries: list[Any] = [value]
            keys = [task_type]
        elif isinstance(value, (list, tuple)):
            entries = list(value)
            keys = [f"{task_type}[{i}]" for i in range(len(entries))]
        elif value is None or isinstance(value, Mapping):
            entries, keys = [], []
            if value:
                raise UserError(
                    f"Invalid value for `{task_type}` in {where}: a mapping. Received: {task_type}={short(value)}. "
                    f"Expected a list of host:port (or one host:port string)."
                )
        else:  # a number, a bool: one malformed address
            entries, keys = [value], [task_type]
        if not entries:
            raise UserError(
                f"Empty task list for `{task_type}` in {where}. Received: {task_type}={short(value)}. "
                f"Expected at least one host:port, or no `{task_type}` key at all."
            )
        if task_type in SINGLE_TASK_TYPES and len(entries) > 1:
            raise UserError(
                f"Too many `{task_type}` tasks in {where}. Received: {len(entries)} ({short(value)}). "
                f"Expected exactly one {task_type}."
            )
        for key, entry in zip(keys, entries):
            identity = address_identity(*parse_address(entry, key=key, where=where))
            if identity in seen:
                first_key, first = seen[identity]
                received = (f"{entry!r} for both `{first_key}` and `{key}`" if first == entry else
                            f"{first!r} for `{first_key}` and {entry!r} for `{key}`, one host's same port")
                raise UserError(
                    f"Duplicate address in {where}. Received: {received}. Expected every task to have its own "
                    f"host:port."
                )
            seen[identity] = key, entry
        tasks[task_type] = tuple(entries)
    if "worker" not in tasks:
        raise UserError(
            f"No `worker` in {where}. Received task types: {', '.join(t for t in TASK_TYPES if t in tasks)}. "
            f"Expected at least one worker, e.g. worker: [10.0.0.2:2222]."
        )
    return ClusterSpec(tasks=tasks, source=source)


def check_task(spec: ClusterSpec, task_type: str, index: int, *, what: str = "task") -> None:
    """Check that ``(task_type, index)`` names a task of ``spec``.

    Args:
        spec: the cluster.
        task_type: one of ``TASK_TYPES``.
        index: the task's index within its type.
        what: how the caller calls the task in errors (e.g. "`--task`").

    Raises:
        UserError: the type is unknown or absent from the cluster, or the
            index is not an integer in range.
    """
    received = f"task={f'{task_type}:{index}'!r}"
    where = source_name(spec.source)
    if task_type not in TASK_TYPES:
        raise UserError(
            f"Invalid {what}: unknown task type. Received: {received}. "
            f"Expected one of: {', '.join(TASK_TYPES)}, as type:index."
        )
    if task_type not in spec.tasks:
        raise UserError(
            f"Invalid {what}: {where} has no `{task_type}` tasks. Received: {received}. "
            f"Expected one of: {', '.join(f'{t}:{i}' for t, i in spec.task_list())}."
        )
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < spec.count(task_type):
        n = spec.count(task_type)
        raise UserError(
            f"Invalid {what}: task index out of range, {where} has {n} `{task_type}` task{'s' if n > 1 else ''}. "
            f"Received: {received}. Expected an index in 0..{n - 1}."
        )
