"""A preemption signal before the training loop ends the process at once; inside it, it is remembered."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tfdist.errors import Preempted


def test_a_signal_before_the_loop_ends_at_once_and_inside_it_is_remembered():
    from tfdist.runtime.preemption import Preemption

    before = signal.getsignal(signal.SIGTERM)
    with Preemption("worker:3") as preemption:
        with pytest.raises(Preempted, match="worker:3 received SIGUSR1 before its first step"):
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(1)  # the handler runs in the main thread, between bytecodes
        preemption.received = None
        preemption.deferred()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert preemption.requested and preemption.reason() == "worker:3 received SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == before  # restored
    # Left preempted, a second signal would end the process with 42 at once, not 143.
    from tfdist.runtime import preemption as preemption_module

    try:
        with pytest.raises(Preempted):
            with Preemption("worker:3") as preemption:
                preemption.deferred()
                raise Preempted("saved")
        assert signal.getsignal(signal.SIGTERM) is preemption_module.exit_preempted
        assert signal.getsignal(signal.SIGUSR1) is preemption_module.exit_preempted
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)



def test_a_signal_after_the_vote_does_not_change_what_asked_the_task_to_stop():
    from tfdist.runtime.preemption import Preemption

    before = signal.getsignal(signal.SIGTERM)
    try:
        with Preemption("worker:0") as preemption:
            preemption.deferred()
            assert preemption.vote() is False  # the cluster then agrees to stop on another task's vote
            os.kill(os.getpid(), signal.SIGTERM)  # a launcher stopping the tasks left
            time.sleep(0.1)
            assert preemption.requested
            assert preemption.reason().startswith("another task of the cluster received SIGTERM or SIGUSR1")
            assert preemption.vote() is True
            assert preemption.reason() == "worker:0 received SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, before)


PREEMPTED_SCRIPT = """
import atexit
from tfdist.errors import preempted_exit
atexit.register(print, "python's teardown ran")
try:
    raise preempted_exit("Preempted at step 3 of 9: local received SIGTERM.")
except SystemExit as e:  # what a notebook's kernel does: it catches it and lives on
    print(f"caught {type(e).__name__} {e.code}: {e}", flush=True)
raise preempted_exit("Preempted at step 3 of 9: local received SIGTERM.")
"""


def test_a_preempted_exit_is_caught_as_a_system_exit_and_uncaught_ends_with_42_before_the_teardown(python):
    proc = python(PREEMPTED_SCRIPT, timeout=60)
    assert proc.returncode == 42, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["caught PreemptedExit 42: Preempted at step 3 of 9: local received SIGTERM."]
    assert proc.stderr == ""


#: A task preempted and on its way out (its line not yet written) when a launcher signals it again.
SIGNALLED_BEFORE_ITS_LINE = """
import os, signal, time
from tfdist.errors import Preempted
from tfdist.runtime import preemption as preemption_module

preemption_module.LAST_LINE_SECONDS = 2.0
try:
    with preemption_module.Preemption("worker:1") as preemption:
        preemption.deferred()
        raise Preempted("Preempted at step 3 of 9: worker:1 received SIGTERM.")
except Preempted as e:
    os.kill(os.getpid(), signal.SIGTERM)  # the launcher stops the tasks left
    time.sleep(0.5)
    print(f"error: {e}", flush=True)  # its last line, after the signal
time.sleep(60)
print("teardown over", flush=True)
"""


def test_a_signal_on_a_preempted_tasks_way_out_lets_it_write_its_line_and_ends_it_with_42(python):
    proc = python(SIGNALLED_BEFORE_ITS_LINE, timeout=50)
    assert proc.returncode == 42, proc.stdout + proc.stderr  # not 143, and within the seconds left, not 60
    assert proc.stdout.splitlines() == ["error: Preempted at step 3 of 9: worker:1 received SIGTERM."]
