"""One registry from strategy name to ``tf.distribute.Strategy``.

``make_strategy(name, ...)`` is the only way tfdist builds a strategy (as TF
Model Garden's ``get_distribution_strategy``): the name is lower-cased and an
unknown one is refused with the list of valid names.

Devices must be set up before TensorFlow initialises its runtime, and for
multi-worker collectives before any other op: ``setup_host`` splits the CPU
into logical devices and sets the inter-op thread pool, and must be called
first. ``make_strategy`` calls it for you when the runtime is still fresh.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from tfdist.errors import UserError

NAMES = ("one_device", "mirrored", "multi_worker_mirrored", "central_storage", "parameter_server")

#: Strategies whose replicas are the local devices of one process.
LOCAL_MULTI_DEVICE = ("mirrored", "central_storage")


def has_gpu() -> bool:
    """Whether TensorFlow sees a GPU (does not initialise the runtime)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def default_cpu_devices(name: str) -> int:
    """Logical CPUs a strategy gets when ``cpu_devices`` is 0 (auto).

    Without GPUs, ``mirrored`` and ``central_storage`` get 2 logical CPUs so a
    run really has 2 replicas; everything else keeps the CPU whole.
    """
    return 2 if name in LOCAL_MULTI_DEVICE and not has_gpu() else 1


def setup_host(*, cpu_devices: int = 1, inter_op_threads: int = 0) -> None:
    """Split the CPU into ``cpu_devices`` logical devices and size the inter-op pool.

    Must run before TensorFlow creates its context. A host that already has
    at least ``cpu_devices`` logical CPUs is left as it is; asking for more
    once the runtime is up raises a ``UserError`` that says so (logical
    devices cannot change later).

    Args:
      cpu_devices: number of logical CPU devices (>= 1).
      inter_op_threads: inter-op thread pool size; 0 keeps TensorFlow's choice.
        Clusters on 2 cores hang unless it is >= number of workers + 1.
    """
    import tensorflow as tf

    if cpu_devices < 1:
        raise UserError(f"Invalid value for `cpu_devices`. Received: cpu_devices={cpu_devices}. Expected an integer >= 1.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if (len(current) if current else 1) < cpu_devices:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpu_devices)]
            )
        except RuntimeError:
            have = len(tf.config.list_logical_devices("CPU"))
            raise UserError(
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


def _parameter_server(*, cluster_resolver=None, ps_shards: int = 0, ps_min_shard_bytes: int = 256 << 10, **_: Any):
    import tensorflow as tf

    if cluster_resolver is None:
        cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not cluster_resolver.cluster_spec().as_dict().get("ps"):
        raise UserError(
            "Invalid cluster for strategy=parameter_server. Received a cluster without `ps` tasks. "
            "Expected --cluster FILE (or TF_CONFIG) with at least one ps, one worker and a chief."
        )
    partitioner = None
    if ps_shards > 1:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=ps_min_shard_bytes, max_shards=ps_shards
        )
    return tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=partitioner)


_BUILDERS: dict[str, Callable[..., Any]] = {
    "one_device": _one_device,
    "mirrored": _mirrored,
    "multi_worker_mirrored": _multi_worker_mirrored,
    "central_storage": _central_storage,
    "parameter_server": _parameter_server,
}


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
      ps_shards, ps_min_shard_bytes: variable partitioning for
        ``parameter_server`` (``MinSizePartitioner``); ps_shards <= 1 disables it.

    Raises:
      UserError: unknown name, or devices that cannot be set up.
    """
    key = str(name).strip().lower()
    if key not in _BUILDERS:
        raise UserError(f"Invalid value for `strategy`. Received: strategy={name!r}. Expected one of: {', '.join(NAMES)}.")
    cpu_devices = cpu_devices or default_cpu_devices(key)
    if key in LOCAL_MULTI_DEVICE:
        setup_host(cpu_devices=cpu_devices)
    return _BUILDERS[key](
        cpu_devices=cpu_devices,
        cluster_resolver=cluster_resolver,
        communication=communication,
        bytes_per_pack=bytes_per_pack,
        collective_timeout=collective_timeout,
        ps_shards=ps_shards,
        ps_min_shard_bytes=ps_min_shard_bytes,
    )


def grpc_fail_fast_for_parameter_server() -> None:
    """Let the coordinator survive a lost worker (GRPC_FAIL_FAST=use_caller), before TF starts."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
