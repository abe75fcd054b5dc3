"""Everything about "where am I in the cluster", without TensorFlow; the names most callers need."""

from tfdist.cluster.address import split_address
from tfdist.cluster.files import load_cluster_spec
from tfdist.cluster.network import free_ports, public_addresses
from tfdist.cluster.sources import from_environment, resolve_task
from tfdist.cluster.spec import SINGLE_TASK_TYPES, SLURM, TASK_TYPES, TF_CONFIG, ClusterSpec, parse_cluster_spec
from tfdist.cluster.task import Task, parse_task

__all__ = [
    "SINGLE_TASK_TYPES", "SLURM", "TASK_TYPES", "TF_CONFIG", "ClusterSpec", "Task", "free_ports",
    "from_environment", "load_cluster_spec", "parse_cluster_spec", "parse_task", "public_addresses",
    "resolve_task", "split_address",
]
