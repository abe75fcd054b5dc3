"""How each strategy is built: ``make_strategy(name, ...)`` is the only way tfdist builds one."""

from __future__ import annotations

import os
from typing import Any

from tfdist.errors import UserError
from tfdist.strategies.host import default_cpu_devices, local_compute_devices, setup_host
from tfdist.strategies.registry import traits


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


def _parameter_server(*, cluster_resolver=None, **_: Any):
    import tensorflow as tf

    if cluster_resolver is None:
        cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not cluster_resolver.cluster_spec().as_dict().get("ps"):
        raise UserError(
            "Invalid cluster for strategy=parameter_server. Received a cluster without `ps` tasks. "
            "Expected --cluster FILE (or TF_CONFIG) with at least one ps, one worker and a chief."
        )
    # No variable partitioner (Keras 3 cannot train partitioned variables, config.check_retired): the strategy
    # places whole variables on the ps tasks round-robin.
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

    Raises:
      UserError: unknown name, or devices that cannot be set up.
    """
    found = traits(str(name).strip().lower())
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
