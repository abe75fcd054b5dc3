"""Strategies by name: the registry of their traits, this host's devices, and the builders."""

from tfdist.errors import DevicesFixed
from tfdist.strategies.build import communication_options, make_strategy
from tfdist.strategies.host import (
    check_global_batch,
    cluster_replicas,
    cuda_visible_gpus,
    default_cpu_devices,
    has_gpu,
    local_compute_devices,
    replicas_in_sync,
    set_grpc_fail_fast,
    setup_host,
    setup_keras,
    visible_gpus,
)
from tfdist.strategies.registry import (
    AUTO,
    NAMES,
    PS_STEPS_PER_LOOP,
    Traits,
    auto_strategy,
    check_strategy,
    strategy_classes,
    traits,
    traits_of,
    traits_of_class,
)

__all__ = [
    "AUTO", "NAMES", "PS_STEPS_PER_LOOP", "DevicesFixed", "Traits", "auto_strategy",
    "check_global_batch", "check_strategy", "cluster_replicas", "communication_options",
    "cuda_visible_gpus", "default_cpu_devices",
    "has_gpu",
    "local_compute_devices", "make_strategy", "replicas_in_sync", "set_grpc_fail_fast", "setup_host", "setup_keras",
    "strategy_classes",
    "traits", "traits_of", "traits_of_class",
    "visible_gpus",
]
