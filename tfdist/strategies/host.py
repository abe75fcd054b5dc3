"""This host's devices for a strategy (GPUs, logical CPUs, the inter-op pool, the replicas they make) and the
process's Keras settings set after it."""

from __future__ import annotations

import os
import sys

from tfdist.cluster.task import Task
from tfdist.errors import DevicesFixed, UserError
from tfdist.strategies.registry import Traits


#: What a host with a GPU TensorFlow could use has (NVIDIA's driver, ROCm's, WSL's DirectX): without any of
#: them on Linux, TensorFlow sees no GPU, and the checks made before it starts need not import it.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia/gpus", "/dev/kfd", "/dev/dxg")


def physical_gpus() -> int:
    """The GPUs TensorFlow sees (it does not initialise the runtime); 0 on a Linux host with no GPU driver,
    without importing TensorFlow, so that bad input is refused in a second."""
    if sys.platform.startswith("linux") and not any(os.path.exists(path) for path in GPU_DRIVER_PATHS):
        return 0
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def has_gpu() -> bool:
    """Whether TensorFlow sees a GPU (does not initialise the runtime)."""
    return physical_gpus() > 0


def visible_gpus() -> int:
    """The NVIDIA GPUs this process may use, from the driver and ``CUDA_VISIBLE_DEVICES``, without starting
    TensorFlow (``auto`` is resolved before it starts, where bad input is still refused in a second).

    As CUDA reads ``CUDA_VISIBLE_DEVICES``: its entries up to the first that names no device (empty, or negative).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        driver = "/proc/driver/nvidia/gpus"
        return len(os.listdir(driver)) if os.path.isdir(driver) else 0
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def default_cpu_devices(traits: Traits) -> int:
    """Logical CPUs a strategy gets when ``cpu_devices`` is 0 (auto).

    Without GPUs, ``mirrored`` and ``central_storage`` get 2 logical CPUs so a
    run really has 2 replicas; everything else keeps the CPU whole.
    """
    return 2 if traits.local_devices and not has_gpu() else 1


def check_global_batch(global_batch_size: int, replicas: int) -> None:
    """Refuse a global batch that does not split evenly over ``replicas`` (a ``UserError``, status 2)."""
    if global_batch_size % replicas:
        raise UserError(
            f"Invalid value for `--global_batch_size`. Received: global_batch_size={global_batch_size} "
            f"with {replicas} replicas. Expected a multiple of the number of replicas."
        )


def replicas_in_sync(traits: Traits, *, cpu_devices: int, task: Task) -> int:
    """The replicas of the strategy of ``traits``, known before TensorFlow starts (it lists GPUs and starts nothing).

    Local devices: the GPUs, else ``cpu_devices`` (or the default) logical CPUs; multi_worker_mirrored: its
    chief and workers times this host's GPUs, as many on each (``python -m tfdist.doctor`` checks that).
    """
    gpus, t = physical_gpus(), traits
    if t.local_devices:
        return gpus or cpu_devices or default_cpu_devices(traits)
    workers = sum(task.training_spec.count(k) for k in ("chief", "worker")) if not t.coordinator else 1
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
        Clusters on 2 cores hang unless it is >= number of workers + 1.
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


def setup_keras(precision: str, *, seed: int, deterministic: bool) -> None:
    """Keras' precision policy, the seeds and op determinism: the rest of a process's set-up, after its strategy
    (TensorFlow's collectives are configured first)."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_dtype_policy(precision)
    keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()


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


def set_grpc_fail_fast() -> None:
    """Let a coordinator survive a lost worker (GRPC_FAIL_FAST=use_caller), before TF starts."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
