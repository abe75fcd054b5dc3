"""This host's devices for a strategy (GPUs, logical CPUs, the inter-op pool, the replicas they make) and the
process's Keras settings set after it."""

from __future__ import annotations

import os
import re
import sys
from typing import Sequence

from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.task import Task
from tfdist.errors import DevicesFixed, UserError
from tfdist.strategies.registry import Traits, traits


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


#: Where the NVIDIA driver lists the GPUs of this machine (one folder each).
NVIDIA_DRIVER_GPUS = "/proc/driver/nvidia/gpus"


def cuda_visible_gpus(visible: str | None, count: int, uuids: Sequence[str] = ()) -> int:
    """How many of ``count`` GPUs CUDA shows under ``CUDA_VISIBLE_DEVICES=visible``, by CUDA's rules.

    Unset: all of them. Otherwise the entries are GPU numbers, or UUIDs
    (``GPU-...``, unique prefixes of ``uuids`` when those are known;
    ``MIG-...``), as the first entry is. CUDA stops at the first entry that
    names no GPU here (empty, ``-1``, a number past the last GPU, an unknown
    UUID, an entry of the other kind) and shows none when an entry repeats.
    """
    if visible is None:
        return count
    entries = [e.strip() for e in visible.split(",")]
    prefix = next((p for p in ("GPU-", "MIG-") if entries[0].startswith(p)), None)
    seen: list[str] = []
    for entry in entries:
        if prefix is None:
            number = re.match(r"\+?([0-9]+)", entry)  # as strtoul reads it
            if number is None or int(number.group(1)) >= count:
                break
            gpu = str(int(number.group(1)))
        elif not entry.startswith(prefix):
            break
        elif prefix == "GPU-" and uuids:
            matches = [u for u in uuids if u.startswith(entry)]
            if len(matches) != 1:
                break
            gpu = matches[0]
        else:
            gpu = entry
        if gpu in seen:
            return 0
        seen.append(gpu)
    return min(len(seen), count)


def visible_gpus() -> int:
    """The GPUs this process may use, as TensorFlow will see them, without starting it (``auto`` is resolved
    before it starts, where bad input is still refused in a second).

    With NVIDIA's driver: its GPUs as ``CUDA_VISIBLE_DEVICES`` narrows them (``cuda_visible_gpus``); without it,
    ``physical_gpus`` (0 on a Linux host with no GPU driver, whatever ``CUDA_VISIBLE_DEVICES`` says).
    """
    if os.path.isdir(NVIDIA_DRIVER_GPUS):
        return cuda_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), len(os.listdir(NVIDIA_DRIVER_GPUS)))
    return physical_gpus()


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

    Local devices: the GPUs, else ``cpu_devices`` (or the default) logical CPUs; a cluster: ``cluster_replicas``
    with this host's GPUs, as many on each (``python -m tfdist.doctor`` checks that).
    """
    gpus = physical_gpus()
    if traits.local_devices:
        return gpus or cpu_devices or default_cpu_devices(traits)
    return cluster_replicas(traits.name, task.spec, gpus) or 1


def cluster_replicas(strategy: str, spec: ClusterSpec, gpus: int) -> int | None:
    """The replicas of ``strategy`` over the training tasks of ``spec`` with ``gpus`` GPUs on each (a CPU is one
    replica): ``multi_worker_mirrored``'s chief and workers times their GPUs; one worker's under a coordinator,
    which gives each step to one worker; 1 for ``one_device``; None for the other one-process strategies, whose
    replicas come from the host (its GPUs, else ``cpu_devices``).
    """
    t = traits(strategy)
    if not t.multi_process:
        return None if t.local_devices else 1
    workers = 1 if t.coordinator else sum(spec.training_spec().count(k) for k in ("chief", "worker"))
    return workers * max(1, gpus)


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
