"""The one registry of strategies: each name's traits, the cluster it needs, and how it is built.

Everything that differs between strategies is a trait (``Traits``), read
through ``traits(name)``; no other module compares a strategy's name, and
``config`` takes its names from ``NAMES``. ``make_strategy(name, ...)`` is the
only way tfdist builds a strategy: the name is lower-cased and an unknown one is
refused with the list of valid names. Devices must be set up before TensorFlow
initialises its runtime (``setup_host``, which ``make_strategy`` calls while the
runtime is still fresh).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from tfdist.cluster.spec import TASK_TYPES, ClusterSpec, source_name
from tfdist.cluster.task import Task
from tfdist.errors import DevicesFixed, UserError

#: The ``ps_shards`` values that work: 0 and 1, whole variables (see ``check_ps_shards``).
PS_SHARDS_SUPPORTED = (0, 1)

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
        build: makes the ``tf.distribute.Strategy`` (``make_strategy``'s keyword arguments).
    """

    name: str
    build: Callable[..., Any] = dataclasses.field(repr=False, compare=False)
    multi_process: bool = False
    coordinator: bool = False
    listens_while_joining: bool = False
    local_devices: bool = False
    ends_with_barrier: bool = False
    default_steps_per_loop: int = 1

    def role(self, task_type: str | None) -> str:
        """``"train"``, ``"serve"`` or ``"evaluate"``: what a task of ``task_type`` does (None: one process)."""
        if task_type == "evaluator":
            return "evaluate"
        if self.coordinator and task_type in ("ps", "worker"):
            return "serve"
        return "train"

    def num_workers(self, task: Task | None) -> int:
        """Tasks that compute steps: the workers, and the chief too unless it coordinates."""
        if task is None:
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


def has_gpu() -> bool:
    """Whether TensorFlow sees a GPU (does not initialise the runtime)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def default_cpu_devices(name: str) -> int:
    """Logical CPUs a strategy gets when ``cpu_devices`` is 0 (auto).

    Without GPUs, ``mirrored`` and ``central_storage`` get 2 logical CPUs so a
    run really has 2 replicas; everything else keeps the CPU whole.
    """
    return 2 if traits(name).local_devices and not has_gpu() else 1


def replicas_in_sync(name: str, *, cpu_devices: int, task: Task | None) -> int:
    """The replicas of strategy ``name``, known before TensorFlow starts (it lists GPUs and starts nothing).

    Local devices: the GPUs, else ``cpu_devices`` (or the default) logical CPUs; multi_worker_mirrored: its
    chief and workers times this host's GPUs, as many on each (``python -m tfdist.doctor`` checks that).
    """
    import tensorflow as tf

    gpus, t = len(tf.config.list_physical_devices("GPU")), traits(name)
    if t.local_devices:
        return gpus or cpu_devices or default_cpu_devices(name)
    workers = sum(task.training_spec.count(k) for k in ("chief", "worker")) if task and not t.coordinator else 1
    return workers * max(1, gpus) if t.multi_process else 1


def setup_host(*, cpu_devices: int = 1, inter_op_threads: int = 0) -> None:
    """Split the CPU into ``cpu_devices`` logical devices and size the inter-op pool.

    Must run before TensorFlow creates its context. A host that already has
    at least ``cpu_devices`` logical CPUs is left as it is; asking for more
    once the runtime is up raises ``DevicesFixed`` (a ``UserError``) that says so (logical
    devices cannot change later).

    Args:
      cpu_devices: number of logical CPU devices (>= 1).
      inter_op_threads: inter-op thread pool size; 0 keeps TensorFlow's choice.
        An in-process cluster on a small machine hangs unless it is >= number of workers + 1 (DESIGN.md).
    """
    import tensorflow as tf

    if cpu_devices < 1:
        raise UserError("Invalid value for `cpu_devices`. "
                        f"Received: cpu_devices={cpu_devices}. Expected an integer >= 1.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if (len(current) if current else 1) < cpu_devices:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpu_devices)]
            )
        except RuntimeError:
            have = len(tf.config.list_logical_devices("CPU"))
            raise DevicesFixed(
                f"Cannot split the CPU into {cpu_devices} logical devices: TensorFlow is already "
                f"initialised with {have}. Expected cpu_devices to be set before any TensorFlow op "
                "(restart the process or notebook kernel)."
            ) from None
    if inter_op_threads and tf.config.threading.get_inter_op_parallelism_threads() != inter_op_threads:
        try:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
        except RuntimeError:
            pass  # runtime already up: keep what it has, as TensorFlow itself does


def local_compute_devices(cpu_devices: int) -> list[str]:
    """All visible GPUs, or the first ``cpu_devices`` logical CPUs when there are none."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(cpus) < cpu_devices:
        raise UserError(
            f"Invalid value for `cpu_devices`. Received: cpu_devices={cpu_devices}, but only {len(cpus)} "
            "logical CPUs exist. Expected setup_host(cpu_devices=...) before TensorFlow starts."
        )
    return cpus[:cpu_devices]


def _one_device(*, cpu_devices: int, **_: Any):
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy(local_compute_devices(1)[0])


def _mirrored(*, cpu_devices: int, **_: Any):
    import tensorflow as tf

    devices = local_compute_devices(cpu_devices)
    # NCCL is the default for GPUs; on CPUs the only choice is reducing to one device.
    cross_device_ops = None if "GPU" in devices[0].upper() else tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)


def _central_storage(*, cpu_devices: int, **_: Any):
    import tensorflow as tf

    devices = local_compute_devices(cpu_devices)
    # With several devices, variables live on the host CPU and computation on
    # every device; with one GPU, TensorFlow's default keeps them on that GPU.
    on_one_gpu = len(devices) == 1 and "GPU" in devices[0].upper()
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=devices, parameter_device=None if on_one_gpu else "/cpu:0"
    )


def communication_options(*, communication: str = "auto", bytes_per_pack: int = 0, collective_timeout: float = 0.0):
    """``CommunicationOptions`` for multi-worker all-reduce (implementation, packing, timeout)."""
    import tensorflow as tf

    implementations = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }
    if communication not in implementations:
        raise UserError(
            f"Invalid value for `communication`. Received: communication={communication!r}. "
            f"Expected one of: {', '.join(implementations)}."
        )
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack,
        timeout_seconds=collective_timeout or None,
        implementation=implementations[communication],
    )


def _multi_worker_mirrored(
    *, cluster_resolver=None, communication: str = "auto", bytes_per_pack: int = 0,
    collective_timeout: float = 0.0, **_: Any,
):
    import tensorflow as tf

    options = communication_options(
        communication=communication, bytes_per_pack=bytes_per_pack, collective_timeout=collective_timeout
    )
    if cluster_resolver is None and not os.environ.get("TF_CONFIG", "").strip():
        os.environ.pop("TF_CONFIG", None)  # an empty TF_CONFIG means one worker, not bad JSON
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver, communication_options=options)


def check_ps_shards(ps_shards: int) -> None:
    """Refuse variable partitioning (``ps_shards`` > 1): Keras 3 cannot train partitioned variables.

    With a variable partitioner, ``ParameterServerStrategy`` makes each large
    variable a ``ShardedVariable``, and a Keras 3 variable wraps it whole:
    ``tape.gradient`` asks the Keras variable for its ``handle``, which a
    ``ShardedVariable`` does not have ("'ShardedVariable' object has no
    attribute 'handle'"), and taking the gradients per shard instead fails in
    the Keras optimizer's update ("ShardedVariable doesn't support being used
    as a reference", on TF 2.21 + Keras 3.15). Without a partitioner
    the strategy still spreads whole variables over every ps task
    (round-robin). Called by ``config.validate`` and ``make_strategy``.

    Raises:
        UserError: ``ps_shards`` is not 0 or 1.
    """
    if ps_shards not in PS_SHARDS_SUPPORTED:
        raise UserError(
            f"Invalid value for `--ps_shards`: variable partitioning does not work with Keras 3 (its variables "
            f"cannot wrap TensorFlow's ShardedVariable). Received: ps_shards={ps_shards!r}. Expected 0 or 1: "
            f"whole variables, which parameter_server spreads over all its ps tasks."
        )


def _parameter_server(*, cluster_resolver=None, **_: Any):
    import tensorflow as tf

    if cluster_resolver is None:
        cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not cluster_resolver.cluster_spec().as_dict().get("ps"):
        raise UserError(
            "Invalid cluster for strategy=parameter_server. Received a cluster without `ps` tasks. "
            "Expected --cluster FILE (or TF_CONFIG) with at least one ps, one worker and a chief."
        )
    # No variable partitioner (check_ps_shards): the strategy places whole variables on the ps tasks round-robin.
    return tf.distribute.ParameterServerStrategy(cluster_resolver)


_TRAITS = {
    t.name: t
    for t in (
        Traits(name="one_device", build=_one_device),
        Traits(name="mirrored", build=_mirrored, local_devices=True),
        Traits(name="multi_worker_mirrored", build=_multi_worker_mirrored, multi_process=True,
               listens_while_joining=True, ends_with_barrier=True),
        Traits(name="central_storage", build=_central_storage, local_devices=True),
        Traits(name="parameter_server", build=_parameter_server, multi_process=True, coordinator=True,
               default_steps_per_loop=PS_STEPS_PER_LOOP),
    )
}

#: Every strategy name, in the order the CLI and the docs list them.
NAMES = tuple(_TRAITS)


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


def check_strategy(spec: ClusterSpec, strategy: str) -> None:
    """Check that the cluster has the tasks ``strategy`` needs (``Traits.check_cluster``).

    Raises:
        UserError: the strategy is unknown, or the cluster does not fit it.
    """
    traits(strategy).check_cluster(spec)


def make_strategy(
    name: str,
    *,
    cpu_devices: int = 0,
    cluster_resolver=None,
    communication: str = "auto",
    bytes_per_pack: int = 0,
    collective_timeout: float = 0.0,
    ps_shards: int = 0,
    ps_min_shard_bytes: int = 256 << 10,
):
    """Build the strategy called ``name``.

    Args:
      name: one of ``NAMES`` (case-insensitive).
      cpu_devices: logical CPUs for ``mirrored``/``central_storage`` without
        GPUs; 0 picks ``default_cpu_devices(name)``. With GPUs, all visible GPUs
        are used instead.
      cluster_resolver: for ``multi_worker_mirrored`` and ``parameter_server``;
        None reads TF_CONFIG.
      communication, bytes_per_pack, collective_timeout: multi-worker
        all-reduce options (see ``communication_options``).
      ps_shards: 0 or 1 (whole variables); more is refused (``check_ps_shards``).
      ps_min_shard_bytes: accepted for configs that set it; it has no effect
        without partitioning.

    Raises:
      UserError: unknown name, ``ps_shards`` > 1, or devices that cannot be set up.
    """
    key = str(name).strip().lower()
    if key not in _TRAITS:
        raise UserError("Invalid value for `strategy`. "
                        f"Received: strategy={name!r}. Expected one of: {', '.join(NAMES)}.")
    check_ps_shards(ps_shards)  # before any device is set up
    cpu_devices = cpu_devices or default_cpu_devices(key)
    if _TRAITS[key].local_devices:
        setup_host(cpu_devices=cpu_devices)
    return _TRAITS[key].build(
        cpu_devices=cpu_devices,
        cluster_resolver=cluster_resolver,
        communication=communication,
        bytes_per_pack=bytes_per_pack,
        collective_timeout=collective_timeout,
    )


def set_grpc_fail_fast() -> None:
    """Let a coordinator survive a lost worker (GRPC_FAIL_FAST=use_caller), before TF starts (DESIGN.md)."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
