"""A cluster on this machine: free loopback ports and in-process gRPC servers.

Tests and notebooks use ``in_process_cluster`` to run ``parameter_server`` with
real ``tf.distribute.Server``s talking gRPC on 127.0.0.1, as TensorFlow's own
tests and tutorial do. Binding is to 127.0.0.1 only: TensorFlow's gRPC server
has no authentication and executes what it receives.
"""

from __future__ import annotations

import contextlib
import errno
import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    with contextlib.ExitStack() as stack:
        sockets = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]


def answers(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (a cheap "is the task up")."""
    from tfdist.cluster import split_address

    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_in_use(port: int) -> bool:
    """Whether a TCP port is already bound for listening on this machine.

    TensorFlow's gRPC server listens on *every* interface (``0.0.0.0``,
    hard-coded in its ``grpc_server_lib.cc``) whatever host the cluster spec
    names, so the port is tried on the wildcard address. ``SO_REUSEADDR``
    keeps connections in TIME_WAIT (a task of an earlier run on that port)
    from counting: only a listening socket makes the port busy, as for gRPC.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def in_process_cluster(*, num_workers: int = 2, num_ps: int = 1):
    """Start ``num_workers`` worker and ``num_ps`` ps servers in this process.

    Returns a ``SimpleClusterResolver`` for a ``ParameterServerStrategy`` whose
    coordinator is this process. The servers live as long as the process.
    Inter-op threads are raised to ``num_workers + 1`` because on 2 cores the
    cluster otherwise hangs (DESIGN.md).
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
