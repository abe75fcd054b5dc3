"""``python -m tfdist.launch``: every task of a cluster spec as a process on this machine (torchrun for TensorFlow).

    # two workers of multi_worker_mirrored, on free ports of 127.0.0.1
    python -m tfdist.launch --cluster configs/clusters/local_mwm.yaml --local -- \\
        python -m tfdist.train --strategy multi_worker_mirrored --config quick
    # any script that reads TF_CONFIG itself, restarted (all tasks) up to twice if one fails
    python -m tfdist.launch --cluster configs/clusters/local_mwm.yaml --local --max_restarts 2 -- \\
        python examples/plain_tf_multi_worker.py

COMMAND (everything after ``--``) runs once per task of the file, each with
that task's TF_CONFIG in its environment (``child_env``), so it can be
``python -m tfdist.train ...`` (which reads TF_CONFIG when ``--cluster`` is
not given) or any script written for TF_CONFIG. Every line a task prints is
prefixed with the task: ``[worker:1] ...``; the launcher's own lines start
with ``[launch]`` (on stderr).

Addresses: with ``--local`` every address is rewritten to 127.0.0.1 on free
ports (``localize``); without it every host of the file must be a loopback
address and every port free (``check_local``). The launcher itself listens on
nothing. TensorFlow's gRPC server, however, binds its port on every interface
(``0.0.0.0``, hard-coded in TensorFlow), with no authentication: on a machine
whose ports others can reach, firewall them or use an isolated network.

Exit status: the leader's (the chief, else worker 0) once it has finished and
the other tasks have ended, or the status of the first failure that stops the
cluster (a signal ``N`` counts as ``128 + N``). A failure stops the cluster
unless the task is a ``worker`` of a cluster with ``ps`` tasks (the
coordinator goes on without it, while one worker is left) or the
``evaluator`` (a side-car). Stopping means SIGTERM to each task's process
group, then SIGKILL after ``--grace_seconds`` (``multi_worker_mirrored``
tasks ignore SIGTERM: TensorFlow catches it), so no process is left behind;
Ctrl-C and SIGTERM to the launcher do the same (status 130 or 143), as do
tasks still running ``--shutdown_timeout`` seconds after the leader ended.

``--max_restarts N``: after a failure that stops the cluster, start every
task again, up to N times (as torchrun does); a tfdist run then resumes from
the latest checkpoint in its ``--model_dir``. With ``--local`` each restart
gets new free ports. Status 2 (a user error) and 3 (a diverged loss) are
not retried: a restart would end the same way.

A port can be taken between ``--local`` picking it and the task binding it;
a tfdist task then ends with ``error: Address already in use: ...`` (status
2, ``cluster.peers``), and with ``--local`` the launcher stops every task and
starts them all on new ports, up to ``PORT_RETRIES`` times (not restarts).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Mapping, Sequence

from absl import flags

from tfdist import cluster as cluster_lib
from tfdist.cluster.network import free_ports, is_loopback, port_in_use
from tfdist.errors import EXIT_CODES, PERMANENT_EXIT_CODES, UserError, run_main

FLAGS = flags.FLAGS

#: Exit statuses of tfdist that ``--max_restarts`` does not retry: a restart would fail the same way.
NOT_RESTARTED = {code: EXIT_CODES[code] for code in PERMANENT_EXIT_CODES}

#: How a tfdist task that could not bind its port ends (its last line, see ``cluster.peers``), and how many
#: times ``--local`` then starts every task again on new ports before the launcher gives up.
ADDRESS_IN_USE = b"error: Address already in use"
PORT_RETRIES = 3


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none."""
    flags.DEFINE_string("cluster", None, "Cluster spec file (YAML or JSON).", flag_values=flag_values)
    flags.DEFINE_bool("local", False, "Rewrite every address to 127.0.0.1 on free ports.", flag_values=flag_values)
    flags.DEFINE_integer("max_restarts", 0, "Restart every task after a failure, up to this many times.",
                         lower_bound=0, flag_values=flag_values)
    flags.DEFINE_float("grace_seconds", 5.0, "Seconds between SIGTERM and SIGKILL when stopping tasks.",
                       lower_bound=0.0, flag_values=flag_values)
    flags.DEFINE_float("shutdown_timeout", 60.0, "Seconds the other tasks may run on after the leader has finished.",
                       lower_bound=0.0, flag_values=flag_values)


# --------------------------------------------------------------------------- addresses and environments


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


def child_env(base: Mapping[str, str], task: cluster_lib.Task) -> dict[str, str]:
    """The environment of one task: ``base`` plus its TF_CONFIG, and unbuffered Python output.

    ``PYTHONUNBUFFERED=1`` makes a Python task's lines reach the launcher (and
    its prefix) as they are printed, not when a buffer fills.
    """
    return {**base, "TF_CONFIG": task.tf_config_json(), "PYTHONUNBUFFERED": "1"}


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: ``128 + N`` for a child ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


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


# --------------------------------------------------------------------------- processes


@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen
    pumps: list[threading.Thread] = dataclasses.field(default_factory=list)
    reported: bool = False
    address_in_use: bool = False  # it printed ADDRESS_IN_USE


def _pump(stream: BinaryIO, sink: BinaryIO, prefix: bytes, lock: threading.Lock, process: _Process) -> None:
    """Copy ``stream`` to ``sink`` line by line, each line prefixed (a thread per pipe)."""
    for line in iter(stream.readline, b""):
        if line.startswith(ADDRESS_IN_USE):
            process.address_in_use = True
        with lock:
            sink.write(prefix + (line if line.endswith(b"\n") else line + b"\n"))
            sink.flush()
    stream.close()


class LocalCluster:
    """The processes of one start of the cluster: start, reap, stop.

    Args:
        spec: the cluster (its addresses are the ones the tasks get).
        command: argv run for every task.
        env: the base environment of every task.
        out, err: where the tasks' stdout and stderr lines go, prefixed.
        log: prints one ``[launch]`` line.
    """

    def __init__(self, spec: cluster_lib.ClusterSpec, command: Sequence[str], *, env: Mapping[str, str],
                 out: BinaryIO, err: BinaryIO, log: Callable[[str], None]):
        self.spec = spec
        self.command = list(command)
        self.env = env
        self.out, self.err, self.log = out, err, log
        self._lock = threading.Lock()
        self.processes: list[_Process] = []

    def start(self) -> None:
        """Start every task, each in its own process group (so that stopping it stops its children too)."""
        for task_type, index in self.spec.task_list():
            task = cluster_lib.Task(spec=self.spec, type=task_type, index=index)
            name = task.name
            try:
                popen = subprocess.Popen(
                    self.command, env=child_env(self.env, task), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                )
            except OSError as e:
                self.stop(0.0)
                raise UserError(
                    f"Cannot run the command for {name}: {e.strerror or e}. Received: {' '.join(self.command)!r}. "
                    "Expected an executable command after --, e.g. python -m tfdist.train ..."
                ) from None
            prefix = f"[{name}] ".encode()
            process = _Process(name, popen)
            process.pumps = [threading.Thread(target=_pump, args=(pipe, sink, prefix, self._lock, process), daemon=True)
                             for pipe, sink in ((popen.stdout, self.out), (popen.stderr, self.err))]
            for pump in process.pumps:
                pump.start()
            self.processes.append(process)
            self.log(f"{name} started (pid {popen.pid}) at {self.spec.address(task_type, index)}")

    def reap(self) -> list[tuple[str, int, bool]]:
        """The tasks that ended since the last call: ``(name, exit status, whether its address was in use)``."""
        ended = []
        for process in self.processes:
            if not process.reported and process.popen.poll() is not None:
                process.reported = True
                for pump in process.pumps:
                    pump.join(timeout=5.0)  # the rest of its output, unless a grandchild holds the pipe
                ended.append((process.name, exit_status(process.popen.returncode), process.address_in_use))
        return ended

    def running(self) -> list[str]:
        """Names of the tasks still running."""
        return [p.name for p in self.processes if p.popen.poll() is None]

    def _signal_groups(self, signum: int) -> bool:
        """Send ``signum`` to every task's process group that still has a process; whether any had."""
        any_left = False
        for process in self.processes:
            try:
                os.killpg(process.popen.pid, signum)
                any_left = True
            except (ProcessLookupError, PermissionError):
                pass
        return any_left

    def stop(self, grace: float) -> None:
        """Stop every process started: SIGTERM to each group, SIGKILL after ``grace`` seconds; wait for all."""
        if self._signal_groups(signal.SIGTERM):
            deadline = time.monotonic() + grace
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.running():
                self.log(f"{', '.join(self.running())} still running {grace:g}s after SIGTERM: SIGKILL")
            self._signal_groups(signal.SIGKILL)
        for process in self.processes:
            try:
                process.popen.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self.log(f"{process.name} (pid {process.popen.pid}) did not end after SIGKILL")
            for pump in process.pumps:
                pump.join(timeout=2.0)


class _Signals:
    """SIGINT and SIGTERM to the launcher, remembered (not raised) so that it can stop its tasks first."""

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


@dataclasses.dataclass
class _Outcome:
    status: int
    failed: str | None = None  # the task whose failure stopped the cluster; None when it was not a failure
    address_in_use: bool = False  # that task could not bind its port


def _run_once(cluster: LocalCluster, signals: _Signals, *, grace: float, shutdown_timeout: float,
              poll: float, new_ports: bool = False) -> _Outcome:
    """Start the cluster, wait for it to finish or fail, stop what is left; ``new_ports``: a port taken stops it."""
    spec = cluster.spec
    leader = "{}:{}".format(*spec.leader())
    leader_done_at = None
    leader_status = None
    workers_failed = 0
    cluster.start()
    try:
        while True:
            if signals.received is not None:
                cluster.log(f"received {signal.Signals(signals.received).name}; stopping every task")
                return _Outcome(128 + signals.received)
            for name, status, address_in_use in cluster.reap():
                cluster.log(f"{name} exited with status {status}")
                if name == leader:
                    leader_status, leader_done_at = status, time.monotonic()
                if status != 0 and address_in_use and new_ports:
                    cluster.log(f"{name} found its address in use; stopping every task")
                    return _Outcome(status, failed=name, address_in_use=True)
                if status != 0:
                    task_type = name.split(":")[0]
                    workers_failed += task_type == "worker"
                    if stops_cluster(spec, task_type) or name == leader or workers_failed == spec.count("worker"):
                        cluster.log(f"{name} failed; stopping every task")
                        return _Outcome(status, failed=None if leader_status == 0 and name != leader else name)
                    cluster.log(f"{name} failed; the others go on without it")
            running = cluster.running()
            if not running:
                return _Outcome(leader_status if leader_status is not None else 0)
            if leader_done_at is not None and time.monotonic() - leader_done_at > shutdown_timeout:
                cluster.log(f"{', '.join(running)} still running {shutdown_timeout:g}s after {leader} finished; "
                            "stopping them")
                return _Outcome(leader_status)
            time.sleep(poll)
    finally:
        cluster.stop(grace)


def launch(spec: cluster_lib.ClusterSpec, command: Sequence[str], *, local: bool = False, max_restarts: int = 0,
           grace: float = 5.0, shutdown_timeout: float = 60.0, env: Mapping[str, str] | None = None,
           out: BinaryIO | None = None, err: BinaryIO | None = None, poll: float = 0.1) -> int:
    """Run ``command`` once per task of ``spec`` until the cluster finishes; returns the exit status.

    See the module docstring for addresses, prefixes, exit status, stopping
    and restarts.

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
    with _Signals() as signals:
        while True:
            current = localize(spec) if local else spec
            if not local:
                check_local(current)
            cluster = LocalCluster(current, command, env=env, out=out, err=err, log=log)
            outcome = _run_once(cluster, signals, grace=grace, shutdown_timeout=shutdown_timeout, poll=poll,
                                new_ports=local)
            if outcome.address_in_use and port_retries < PORT_RETRIES and signals.received is None:
                port_retries += 1
                log(f"starting every task again on new ports (retry {port_retries} of {PORT_RETRIES}): "
                    f"{outcome.failed}'s port was taken before it could bind it")
                continue
            final = outcome.failed is None or restarts >= max_restarts or signals.received is not None
            if not final and outcome.status in NOT_RESTARTED:
                log(f"not restarting: status {outcome.status} is {NOT_RESTARTED[outcome.status]}, which a restart repeats")
                final = True
            if final:
                log(f"exit status {outcome.status}")
                return outcome.status
            restarts += 1
            log(f"restarting every task (restart {restarts} of {max_restarts}) after {outcome.failed} failed "
                f"with status {outcome.status}")


def main(argv: list[str]) -> int:
    """Launch every task of ``--cluster`` running the command after ``--``; see the module docstring."""
    if not FLAGS.cluster:
        raise UserError(
            f"Missing `--cluster`. Received: cluster={FLAGS.cluster!r}. "
            "Expected a cluster spec file (YAML or JSON), e.g. --cluster configs/clusters/local_mwm.yaml."
        )
    spec = cluster_lib.load_cluster_spec(FLAGS.cluster)
    return launch(spec, argv[1:], local=FLAGS.local, max_restarts=FLAGS.max_restarts, grace=FLAGS.grace_seconds,
                  shutdown_timeout=FLAGS.shutdown_timeout)


def entry() -> None:
    """The ``tfdist-launch`` console script."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
