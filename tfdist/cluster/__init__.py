"""Everything about "where am I in the cluster", without TensorFlow.

A run's cluster flows one way through these modules, each one idea:

- ``address``: the grammar of ``host:port``;
- ``spec``: ``ClusterSpec``, every task's address by type, validated;
- ``task``: ``Task``, one task of a spec (this process's), and its TF_CONFIG;
- ``files``: cluster spec files (YAML or JSON, strict);
- ``slurm``: the cluster of a Slurm job step (``--cluster slurm``);
- ``kubernetes``: the cluster of a pod of an Indexed Job or a JobSet (``--cluster kubernetes``);
- ``sources``: which of those gives this process its task (flags, TF_CONFIG, Slurm, a pod);
- ``network``: free ports, TCP probes, loopback and public addresses;
- ``peers``: the bounded rendezvous before TensorFlow binds, and liveness watches;
- ``commands``: the shell command that starts each task on its host;
- ``local``: a cluster of in-process gRPC servers for tests and notebooks (imports TensorFlow).

The names most callers need are re-exported here (``from tfdist import cluster;
cluster.load_cluster_spec(...)``). Only ``slurm.resolve`` and ``local``
import TensorFlow, and only when called: CLIs read the cluster before they set
the environment variables and logical devices that TensorFlow reads once.
"""

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
