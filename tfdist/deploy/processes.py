"""The processes of one start of a cluster on this machine, for ``tfdist.launch``: start, reap, stop, signals."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Mapping, Sequence

from tfdist import cluster as cluster_lib
from tfdist import quiet
from tfdist.errors import PREEMPTED_EXIT_CODE, UserError

#: How a tfdist task that could not bind its port ends (its last line, see ``cluster.peers``).
ADDRESS_IN_USE = b"error: Address already in use"

#: The launcher's signals that mean "preempted": SIGTERM (Kubernetes, ``scancel``, ``kill``) and SIGUSR1
#: (``sbatch --signal``). Each is forwarded to every task as SIGTERM, which tfdist tasks treat the same.
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def child_env(base: Mapping[str, str], task: cluster_lib.Task) -> dict[str, str]:
    """The environment of one task: ``base`` plus its TF_CONFIG, and unbuffered Python output.

    ``PYTHONUNBUFFERED=1`` makes a Python task's lines reach the launcher (and
    its prefix) as they are printed, not when a buffer fills.
    """
    return {**base, "TF_CONFIG": task.tf_config_json(), "PYTHONUNBUFFERED": "1"}


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: ``128 + N`` for a child ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def die_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child SIGKILLed by the kernel when process ``parent`` dies; None off Linux.

    ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` fires when the *thread* that forked
    the child ends, so call ``Popen`` from a thread that outlives the child
    (the launcher's main thread does). A parent that died before the call
    would never trigger it: the child has already been handed to another
    parent, so it then checks ``os.getppid()`` against ``parent`` and kills
    itself. libc is looked up here, in the parent: between fork and exec the
    child only makes the call (``preexec_fn`` must do little, as other
    threads of the parent, the output pumps, may hold locks at the fork).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the prctl: nobody would stop this child
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen
    pumps: list[threading.Thread] = dataclasses.field(default_factory=list)
    reported: bool = False
    address_in_use: bool = False  # it printed ADDRESS_IN_USE


def _pump(stream: BinaryIO, sink: BinaryIO, prefix: bytes, lock: threading.Lock, process: _Process,
          drop_noise: bool) -> None:
    """Copy ``stream`` to ``sink`` line by line, each line prefixed (a thread per pipe).

    With ``drop_noise``, TensorFlow's known start-up lines (``quiet.is_noise``, as tfdist's own CLIs drop them)
    are left out.
    """
    for line in iter(stream.readline, b""):
        if line.startswith(ADDRESS_IN_USE):
            process.address_in_use = True
        if drop_noise and quiet.is_noise(line.rstrip(b"\n")):
            continue
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
        show_startup_noise: pass TensorFlow's known start-up lines on too (by default they are dropped).
    """

    def __init__(self, spec: cluster_lib.ClusterSpec, command: Sequence[str], *, env: Mapping[str, str],
                 out: BinaryIO, err: BinaryIO, log: Callable[[str], None], show_startup_noise: bool = False):
        self.spec = spec
        self.drop_noise = not show_startup_noise
        self.command = list(command)
        self.env = env
        self.out, self.err, self.log = out, err, log
        self._lock = threading.Lock()
        self.processes: list[_Process] = []

    def start(self) -> None:
        """Start every task, each in its own process group (so that stopping it stops its children too).

        Each task also dies with this process (``die_with``), even if this
        process is killed with SIGKILL.

        Raises:
            UserError: the command cannot be run (the tasks already started are stopped).
        """
        preexec = die_with(os.getpid())
        for task_type, index in self.spec.task_list():
            task = cluster_lib.Task(spec=self.spec, type=task_type, index=index)
            name = task.name
            try:
                popen = subprocess.Popen(
                    self.command, env=child_env(self.env, task), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=preexec,
                )
            except OSError as e:
                self.stop(0.0)
                raise UserError(
                    f"Cannot run the command for {name}: {e.strerror or e}. Received: {' '.join(self.command)!r}. "
                    "Expected an executable command after --, e.g. python -m tfdist.train ..."
                ) from None
            prefix = f"[{name}] ".encode()
            process = _Process(name, popen)
            process.pumps = [threading.Thread(target=_pump, args=(pipe, sink, prefix, self._lock, process,
                                                                      self.drop_noise), daemon=True)
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

    def stop(self, grace: float, hurry: Callable[[], bool] = lambda: False) -> None:
        """Stop every process started: SIGTERM to each group, SIGKILL after ``grace`` seconds; wait for all.

        The grace is what a tfdist task has to save its checkpoint (it treats
        SIGTERM as a preemption); ``hurry()`` true (a second Ctrl-C) cuts it
        short. Logs ``NAME exited with status N (stopped)`` for each task
        that ended while being stopped (a tfdist task: 42 once it has saved
        its checkpoint; 137: SIGKILLed).
        """
        if self._signal_groups(signal.SIGTERM):
            deadline = time.monotonic() + grace
            while self.running() and time.monotonic() < deadline and not hurry():
                time.sleep(0.05)
            if self.running():
                why = "at the second Ctrl-C" if hurry() else f"{grace:g}s after SIGTERM"
                self.log(f"{', '.join(self.running())} still running {why}: SIGKILL")
            self._signal_groups(signal.SIGKILL)
        for process in self.processes:
            try:
                process.popen.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self.log(f"{process.name} (pid {process.popen.pid}) did not end after SIGKILL")
            for pump in process.pumps:
                pump.join(timeout=2.0)
        for name, status, _ in self.reap():
            self.log(f"{name} exited with status {status} (stopped)")


class Signals:
    """SIGINT, SIGTERM and SIGUSR1 to the launcher, remembered (not raised) so that it can stop its tasks first.

    ``received`` is the first signal; a SIGINT after it sets ``hurry`` (a
    second Ctrl-C: SIGKILL the tasks now rather than after the grace).
    Handlers are installed only from the main thread (Python allows no
    other); elsewhere the signals keep their default action.
    """

    def __init__(self):
        self.received: int | None = None
        self.hurry = False
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, *PREEMPTION_SIGNALS):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
        elif signum == signal.SIGINT:
            self.hurry = True

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    @property
    def preempted(self) -> bool:
        """Whether the launcher was asked to stop by a preemption signal (SIGTERM or SIGUSR1)."""
        return self.received in PREEMPTION_SIGNALS

    def status(self) -> int:
        """The launcher's exit status for the signal received: 42 for a preemption, else ``128 + N`` (130)."""
        return PREEMPTED_EXIT_CODE if self.preempted else 128 + self.received
