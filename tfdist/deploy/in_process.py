"""A cluster in this process: in-process gRPC servers on free loopback ports, for tests and notebooks."""

from __future__ import annotations

from tfdist.cluster.network import free_ports


def in_process_cluster(*, num_workers: int = 2, num_ps: int = 1):
    """Start ``num_workers`` worker and ``num_ps`` ps servers in this process.

    Returns a ``SimpleClusterResolver`` for a ``ParameterServerStrategy`` whose
    coordinator is this process. The servers live as long as the process.
    Inter-op threads are raised to ``num_workers + 1`` because on a machine with few cores
    the cluster otherwise hangs.
    """
    import tensorflow as tf

    ports = free_ports(num_workers + num_ps)
    cluster = {
        "worker": [f"127.0.0.1:{p}" for p in ports[:num_workers]],
        "ps": [f"127.0.0.1:{p}" for p in ports[num_workers:]],
    }
    spec = tf.train.ClusterSpec(cluster)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=num_workers + 1)
    for job, count in (("worker", num_workers), ("ps", num_ps)):
        for index in range(count):
            tf.distribute.Server(spec, job_name=job, task_index=index, config=config, protocol="grpc", start=True)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
