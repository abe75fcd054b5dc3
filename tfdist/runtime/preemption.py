"""Preemption: SIGTERM or SIGUSR1 to a training task saves the step reached and ends it with status 42."""

from __future__ import annotations

import signal
import threading

from tfdist.errors import PREEMPTED_EXIT_CODE, Preempted, end_process

#: The signals that mean "preempted": TERM from Kubernetes, launchers and ``scancel``; USR1 from ``sbatch --signal``.
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15."""
    return signal.Signals(signum).name


#: Seconds a preempted task that is signalled again has to write its last line and end by itself, before
#: it is ended with the preempted status.
LAST_LINE_SECONDS = 5.0


def exit_preempted(signum, frame) -> None:
    """After a preempted end: a further signal ends the process with the preempted status, within
    ``LAST_LINE_SECONDS``.

    A launcher stopping the other tasks sends one too; handled by default, it would turn the status 42 of a
    task that saved its step into a death by signal (143) while its teardown runs, and ended at once, the
    task would lose its last line (what stopped it, the checkpoint to resume from) if it had not written it yet.
    """
    timer = threading.Timer(LAST_LINE_SECONDS, end_process, args=(PREEMPTED_EXIT_CODE,))
    timer.daemon = True
    timer.start()


class Preemption:
    """The preemption signals of this process, while a run is on (a context manager).

    Args:
        where: this task's name, for messages (``"worker:1"``, ``"local"``).
    """

    def __init__(self, where: str = "local"):
        self.where = where
        self.received: int | None = None
        self._voted: int | None = None
        self._has_voted = False
        self._deferred = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "Preemption":
        self._install()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        # Left preempted, the checkpoint is saved and the process is on its way out: another preemption
        # signal (a launcher stopping the others) must not turn its status 42 into a death by signal (143).
        preempted = exc_type is not None and issubclass(exc_type, Preempted)
        for signum, handler in self._previous.items():
            signal.signal(signum, exit_preempted if preempted else handler)
        self._previous = {}

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def _handle(self, signum, frame) -> None:
        self.received = signum
        if not self._deferred:
            raise Preempted(
                f"Preempted: {self.where} received {signal_name(signum)} before its first step (from a scheduler, "
                "or from a launcher stopping the cluster because another task ended: see that task's output), so "
                "nothing was trained since the checkpoint it would resume from. Run the same command again to resume."
            )

    def deferred(self) -> "Preemption":
        """From now on a signal is only remembered (``requested``).

        The handler is installed again, as TensorFlow may have replaced it.
        """
        self._deferred = True
        self._install()
        return self

    @property
    def requested(self) -> bool:
        """Whether this process received a preemption signal."""
        return self.received is not None

    def vote(self) -> bool:
        """This task's vote to stop, cast before a chunk: the exit line names the signal it stood on.

        A signal that arrives after the vote (a launcher stopping the tasks that are left once one ended)
        does not change what asked this task to stop.
        """
        self._voted, self._has_voted = self.received, True
        return self._voted is not None

    def reason(self) -> str:
        """What asked this task to stop, for the exit line: its own signal if it voted with one."""
        received = self._voted if self._has_voted else self.received
        if received is not None:
            return f"{self.where} received {signal_name(received)}"
        return f"another task of the cluster received SIGTERM or SIGUSR1 (this is {self.where})"
