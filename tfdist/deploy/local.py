"""Every task of a cluster spec as a process on this machine, and the policy that supervises them."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import BinaryIO, Mapping, Sequence

from tfdist import cluster as cluster_lib
from tfdist import quiet
from tfdist.cluster.network import free_ports, is_loopback, port_in_use
from tfdist.deploy.processes import LocalCluster, Signals
from tfdist.errors import EXIT_CODES, PERMANENT_EXIT_CODES, PREEMPTED_EXIT_CODE, UserError

#: Exit statuses of tfdist that ``max_restarts`` does not retry: a restart would fail the same way.
NOT_RESTARTED = {code: EXIT_CODES[code] for code in PERMANENT_EXIT_CODES}

#: How many times ``local`` starts every task again on new ports when one found its port taken
#: (``processes.ADDRESS_IN_USE``) before the launcher gives up.
PORT_RETRIES = 3

#: Default seconds between SIGTERM and SIGKILL: a tfdist task saves a checkpoint in that time.
GRACE_SECONDS = 60.0


# --------------------------------------------------------------------------- addresses


def localize(spec: cluster_lib.ClusterSpec) -> cluster_lib.ClusterSpec:
    """The same tasks on 127.0.0.1, each on a port that is free right now."""
    ports = iter(free_ports(spec.num_tasks))
    tasks = {t: tuple(f"127.0.0.1:{next(ports)}" for _ in addresses) for t, addresses in spec.tasks.items()}
    return cluster_lib.ClusterSpec(tasks=tasks, source=f"{spec.source} (--local)")


def check_local(spec: cluster_lib.ClusterSpec) -> None:
    """Check that every task of ``spec`` can run here: loopback hosts and free ports.

    Raises:
        UserError: a host is not a loopback address, or a port is taken.
    """
    for task_type, index in spec.task_list():
        address = spec.address(task_type, index)
        host, port = cluster_lib.split_address(address)
        if not is_loopback(host):
            raise UserError(
                f"Invalid cluster for tfdist.launch in cluster spec {spec.source}: {task_type}:{index} is on another "
                f"host. Received: {address}. Expected loopback hosts only (127.0.0.1, ::1, localhost), or --local "
                "to rewrite every address to 127.0.0.1; start tasks on other hosts with python -m tfdist.tfconfig "
                "--commands."
            )
        if port_in_use(port):
            raise UserError(
                f"Address already in use: {address}, the address of {task_type}:{index} in cluster spec "
                f"{spec.source}. Received: port {port} taken by another process. Expected a free port, or --local "
                "to pick free ports."
            )


def stops_cluster(spec: cluster_lib.ClusterSpec, task_type: str) -> bool:
    """Whether a failure of a ``task_type`` task stops the whole cluster.

    The leader's always does; a worker's does not where there are ps tasks
    (``ParameterServerStrategy`` reschedules its steps on the others, so
    only the loss of the last worker stops the cluster, see ``_run_once``),
    nor the evaluator's (a side-car nothing waits for); any other task's does
    (a ``multi_worker_mirrored`` collective needs every worker).
    """
    if task_type == "evaluator":
        return False
    return not (task_type == "worker" and "ps" in spec.tasks)


# --------------------------------------------------------------------------- one start, and restarts


@dataclasses.dataclass
class _Outcome:
    status: int
    failed: str | None = None  # the task whose failure stopped the cluster; None when it was not a failure
    address_in_use: bool = False  # that task could not bind its port


def _ended(status: int) -> str:
    """How a task's non-zero status reads in the launcher's lines."""
    return "was preempted" if status == PREEMPTED_EXIT_CODE else "failed"


def _run_once(cluster: LocalCluster, signals: Signals, *, grace: float, shutdown_timeout: float,
              poll: float, new_ports: bool = False) -> _Outcome:
    """Start the cluster, wait for it to finish, fail or be signalled, stop what is left (bounded by ``grace``).

    ``new_ports``: a task whose port was taken stops the cluster (to start it again on new ports).
    """
    spec = cluster.spec
    leader = "{}:{}".format(*spec.leader())
    leader_done_at = None
    leader_status = None
    workers_failed = 0
    cluster.start()
    try:
        while True:
            if signals.received is not None:
                name = signal.Signals(signals.received).name
                if signals.preempted:
                    cluster.log(f"received {name}: a preemption; stopping every task (SIGTERM, SIGKILL after "
                                f"{grace:g}s)")
                else:
                    cluster.log(f"received {name}; stopping every task (Ctrl-C again: SIGKILL now)")
                return _Outcome(signals.status())
            ended = cluster.reap()
            for name, status, _ in ended:  # every exit first: tasks that ended together are all told of
                cluster.log(f"{name} exited with status {status}")
            for name, status, address_in_use in ended:
                if name == leader:
                    leader_status, leader_done_at = status, time.monotonic()
                if status != 0 and address_in_use and new_ports:
                    cluster.log(f"{name} found its address in use; stopping every task")
                    return _Outcome(status, failed=name, address_in_use=True)
                if status != 0:
                    task_type = name.split(":")[0]
                    workers_failed += task_type == "worker"
                    if stops_cluster(spec, task_type) or name == leader or workers_failed == spec.count("worker"):
                        cluster.log(f"{name} {_ended(status)}; stopping every task")
                        return _Outcome(status, failed=None if leader_status == 0 and name != leader else name)
                    cluster.log(f"{name} {_ended(status)}; the others go on without it")
            running = cluster.running()
            if not running:
                return _Outcome(leader_status if leader_status is not None else 0)
            if leader_done_at is not None and time.monotonic() - leader_done_at > shutdown_timeout:
                cluster.log(f"{', '.join(running)} still running {shutdown_timeout:g}s after {leader} finished; "
                            "stopping them")
                return _Outcome(leader_status)
            time.sleep(poll)
    finally:
        cluster.stop(grace, hurry=lambda: signals.hurry)


def launch(spec: cluster_lib.ClusterSpec, command: Sequence[str], *, local: bool = False, max_restarts: int = 0,
           grace: float = GRACE_SECONDS, shutdown_timeout: float = 60.0, env: Mapping[str, str] | None = None,
           out: BinaryIO | None = None, err: BinaryIO | None = None, poll: float = 0.1,
           show_startup_noise: bool = False) -> int:
    """Run ``command`` once per task of ``spec`` until the cluster finishes; returns the exit status.

    TensorFlow's known start-up lines (``quiet.STARTUP_NOISE``) are dropped from the tasks' output unless
    ``show_startup_noise`` (or the environment's ``TFDIST_TF_LOGS=1``) asks for them.

    Addresses, prefixes, exit status, stopping, signals and restarts: docs/clusters.md. Call it from the
    main thread: only there can it
    catch the signals that stop the cluster in order (elsewhere they keep
    their default action), and its tasks die with the thread that started
    them (``deploy.processes.die_with``).

    Raises:
        UserError: an empty command, a host that is not loopback (without
            ``local``), a port in use, or a command that cannot be run.
    """
    if not command:
        raise UserError(
            "Missing COMMAND. Received: nothing after --. Expected e.g. -- python -m tfdist.train --strategy "
            "multi_worker_mirrored."
        )
    out = out or sys.stdout.buffer
    err = err or sys.stderr.buffer
    lock = threading.Lock()

    def log(text: str) -> None:
        with lock:
            err.write(f"[launch] {text}\n".encode())
            err.flush()

    env = dict(os.environ if env is None else env)
    restarts = port_retries = 0
    with Signals() as signals:
        while True:
            current = localize(spec) if local else spec
            if not local:
                check_local(current)
            cluster = LocalCluster(current, command, env=env, out=out, err=err, log=log,
                                   show_startup_noise=show_startup_noise or quiet.opted_out(env))
            outcome = _run_once(cluster, signals, grace=grace, shutdown_timeout=shutdown_timeout, poll=poll,
                                new_ports=local)
            status = outcome.status
            new_ports = outcome.address_in_use and port_retries < PORT_RETRIES
            restartable = outcome.failed is not None and status not in NOT_RESTARTED
            if signals.received is not None and (new_ports or restartable):
                # A signal while the cluster was stopping after a failure: the launcher stops too, as it was asked.
                log(f"not restarting: received {signal.Signals(signals.received).name}")
                status = signals.status()
            elif new_ports:
                port_retries += 1
                log(f"starting every task again on new ports (retry {port_retries} of {PORT_RETRIES}): "
                    f"{outcome.failed}'s port was taken before it could bind it")
                continue
            elif restartable and restarts < max_restarts:
                restarts += 1
                log(f"restarting every task (restart {restarts} of {max_restarts}) after {outcome.failed} "
                    f"{_ended(status)} with status {status}")
                continue
            elif outcome.failed is not None and status in NOT_RESTARTED and restarts < max_restarts:
                log(f"not restarting: status {status} is {NOT_RESTARTED[status]}, which a restart repeats")
            log(f"exit status {status}")
            return status
