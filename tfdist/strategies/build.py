"""How each strategy is built: ``make_strategy(name, ...)`` is the only way tfdist builds one."""

from __future__ import annotations

import os
from typing import Any

from tfdist.errors import UserError
from tfdist.strategies.host import default_cpu_devices, local_compute_devices, setup_host
from tfdist.strategies.registry import traits

#: The ``ps_shards`` values that work: 0 and 1, whole variables (see ``check_ps_shards``).
PS_SHARDS_SUPPORTED = (0, 1)


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
    (round-robin). Called by ``config.check_runtime`` and ``make_strategy``.

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


#: The builder of each strategy name (the registry's ``NAMES``): ``make_strategy``'s keyword arguments.
_BUILDERS = {
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
        GPUs; 0 picks ``default_cpu_devices``. With GPUs, all visible GPUs
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
    found = traits(str(name).strip().lower())
    check_ps_shards(ps_shards)  # before any device is set up
    cpu_devices = cpu_devices or default_cpu_devices(found)
    if found.local_devices:
        setup_host(cpu_devices=cpu_devices)
    return _BUILDERS[found.name](
        cpu_devices=cpu_devices,
        cluster_resolver=cluster_resolver,
        communication=communication,
        bytes_per_pack=bytes_per_pack,
        collective_timeout=collective_timeout,
    )
