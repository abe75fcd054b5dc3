"""The one registry of strategies: each name's traits (``Traits``), read through ``traits(name)``."""

from __future__ import annotations

import dataclasses
from typing import Collection

from tfdist.cluster.spec import TASK_TYPES, ClusterSpec, source_name
from tfdist.cluster.task import Task
from tfdist.errors import UserError

#: Closures the parameter-server chief schedules before it waits for them (``steps_per_loop`` 0).
#: With one closure per wait only one worker is ever busy; 16 keeps several busy
#: and still reports every ``log_every`` (16) steps.
PS_STEPS_PER_LOOP = 16



@dataclasses.dataclass(frozen=True, kw_only=True)
class Traits:
    """What one strategy is, as data that the rest of tfdist reads instead of comparing names.

    Attributes:
        name: the ``--strategy`` name.
        multi_process: it runs as several processes, one per task of a cluster
            (else it runs in one process, on a cluster of one task at most).
        coordinator: a chief coordinates (``ClusterCoordinator``): its ``ps``
            and ``worker`` tasks only serve, and it needs a chief, a worker
            and a ps; asynchronous, so each worker reads its own data order.
        listens_while_joining: every task waits for every other at start
            (collectives), so each listens on its port while the peers join.
        local_devices: its replicas are the local devices of one process, so
            a host without GPUs is split into logical CPUs.
        ends_with_barrier: every worker waits for all the others at the end.
        default_steps_per_loop: ``steps_per_loop`` when it is left at 0.
        tf_class: the ``tf.distribute`` class that builds it (a dotted name under ``tf.distribute``), by
            which ``traits_of`` reads a strategy object.
        copies_on_replicas: every replica keeps its own copy of each variable, kept equal by all-reduce
            (Keras' variables sync on read, and XLA can compile a replica's step over its copy).
        variables_elsewhere: the variables live once, apart from the replicas (one device of the host, or the
            ps tasks): a replica cannot write them in place and XLA cannot read them from its step.
    """

    name: str
    tf_class: str
    copies_on_replicas: bool = False
    variables_elsewhere: bool = False
    multi_process: bool = False
    coordinator: bool = False
    listens_while_joining: bool = False
    local_devices: bool = False
    ends_with_barrier: bool = False
    default_steps_per_loop: int = 1

    def role(self, task: Task) -> str:
        """``"train"``, ``"serve"`` or ``"evaluate"``: what ``task`` does (``Task.local()`` trains)."""
        if task.type == "evaluator":
            return "evaluate"
        if self.coordinator and task.type in ("ps", "worker"):
            return "serve"
        return "train"

    def num_workers(self, task: Task) -> int:
        """Tasks that compute steps: the workers, and the chief too unless it coordinates (1 alone)."""
        if task.is_local:
            return 1
        return task.spec.count("worker") + (0 if self.coordinator else task.spec.count("chief"))

    def check_cluster(self, spec: ClusterSpec) -> None:
        """Check that ``spec`` has the tasks this strategy needs, before any host starts.

        - several processes, no coordinator (``multi_worker_mirrored``): at
          least one worker and no ``ps`` (a chief and an evaluator are optional);
        - a coordinator (``parameter_server``): at least one ``ps``, at least
          one worker and a chief, which runs the ``ClusterCoordinator``;
        - one process: a cluster of one task at most.

        Raises:
            UserError: the cluster does not fit.
        """
        problem = expected = None
        if self.coordinator:
            missing = [
                name
                for name, ok in (
                    ("a ps task", spec.count("ps") >= 1),
                    ("a worker", spec.count("worker") >= 1),
                    ("a chief (the coordinator)", spec.count("chief") == 1),
                )
                if not ok
            ]
            if missing:
                problem = "missing " + " and ".join(missing)
                expected = "at least one ps, at least one worker and one chief (the coordinator)"
        elif self.multi_process:
            if spec.count("worker") < 1:
                problem, expected = "no worker", "at least one worker"
            elif spec.count("ps"):
                problem = f"ps tasks are for {_names(coordinator=True)}"
                expected = f"no ps tasks (or --strategy={_names(coordinator=True)})"
        elif spec.num_tasks > 1:
            problem = f"{self.name} runs on one machine"
            expected = f"a cluster of one task, or --strategy={_names(multi_process=True)}"
        if problem:
            counts = ", ".join(f"{t}={spec.count(t)}" for t in TASK_TYPES)
            raise UserError(
                f"Invalid cluster for strategy={self.name!r} in {source_name(spec.source)}: {problem}. "
                f"Received: {counts}. Expected {expected}."
            )


_TRAITS = {
    t.name: t
    for t in (
        Traits(name="one_device", tf_class="OneDeviceStrategy"),
        Traits(name="mirrored", tf_class="MirroredStrategy", local_devices=True, copies_on_replicas=True),
        Traits(name="multi_worker_mirrored", tf_class="MultiWorkerMirroredStrategy", multi_process=True,
               listens_while_joining=True, ends_with_barrier=True, copies_on_replicas=True),
        Traits(name="central_storage", tf_class="experimental.CentralStorageStrategy", local_devices=True,
               variables_elsewhere=True),
        Traits(name="parameter_server", tf_class="experimental.ParameterServerStrategy", multi_process=True,
               coordinator=True, variables_elsewhere=True, default_steps_per_loop=PS_STEPS_PER_LOOP),
    )
}

#: Every strategy name, in the order the CLI and the docs list them.
NAMES = tuple(_TRAITS)

#: The strategy name that ``auto_strategy`` resolves: the default of ``tfdist.train``, ``tfdist.fit`` and
#: ``tfdist.setup``.
AUTO = "auto"


def auto_strategy(task_types: Collection[str] | None, local_devices: int) -> str:
    """The strategy ``auto`` stands for: a cluster's (``parameter_server`` with ps tasks, else
    ``multi_worker_mirrored``); without one, ``mirrored`` over several local devices, else ``one_device``.

    Args:
      task_types: the task types of the cluster this task is in (``--cluster``, TF_CONFIG, Slurm,
        Kubernetes), or None without one.
      local_devices: the GPUs this process sees, else the logical CPUs asked for (``cpu_devices``).
    """
    if task_types is not None:
        return "parameter_server" if "ps" in task_types else "multi_worker_mirrored"
    return "mirrored" if local_devices > 1 else "one_device"


def _names(**trait: bool) -> str:
    """The strategies with the given trait values, for messages: ``"multi_worker_mirrored or parameter_server"``."""
    return " or ".join(t.name for t in _TRAITS.values() if all(getattr(t, k) == v for k, v in trait.items()))


def traits(name: str) -> Traits:
    """The traits of strategy ``name``.

    Raises:
        UserError: ``name`` is not a strategy.
    """
    if name not in _TRAITS:
        raise UserError(
            f"Invalid value for `--strategy`. Received: strategy={name!r}. Expected one of: {', '.join(NAMES)}."
        )
    return _TRAITS[name]


def traits_of(strategy) -> Traits | None:
    """The traits of a ``tf.distribute`` strategy object, read from its class; None for a strategy that is none
    of tfdist's (a ``TPUStrategy``, TensorFlow's default strategy)."""
    return traits_of_class(type(strategy))


def traits_of_class(klass: type) -> Traits | None:
    """The traits of the strategies ``klass`` builds (a subclass, such as a deprecated alias, builds its base's);
    None for a class that builds none of tfdist's strategies (``tf.compat.v1``'s classes among them)."""
    import tensorflow as tf

    for row in _TRAITS.values():
        cls = tf.distribute
        for part in row.tf_class.split("."):
            cls = getattr(cls, part)
        if issubclass(klass, cls):
            return row
    return None


def strategy_classes(*, but: type | None = None) -> dict[type, str]:
    """TensorFlow's public strategy classes (but ``but``), each with its public name: the first module that has
    it, TensorFlow 2's before ``tf.compat.v1``'s."""
    import tensorflow as tf

    modules = {"tf.distribute": tf.distribute, "tf.distribute.experimental": tf.distribute.experimental,
               "tf.compat.v1.distribute": tf.compat.v1.distribute,
               "tf.compat.v1.distribute.experimental": tf.compat.v1.distribute.experimental}
    base = (tf.distribute.Strategy, tf.compat.v1.distribute.Strategy)
    found: dict = {}
    for prefix, module in modules.items():
        for name, value in sorted(vars(module).items()):
            if isinstance(value, type) and issubclass(value, base) and value not in base:
                found.setdefault(value, f"{prefix}.{name}")
    found.pop(but, None)
    return found


def check_strategy(spec: ClusterSpec, strategy: str) -> None:
    """Check that the cluster has the tasks ``strategy`` needs (``Traits.check_cluster``).

    Raises:
        UserError: the strategy is unknown, or the cluster does not fit it.
    """
    traits(strategy).check_cluster(spec)
