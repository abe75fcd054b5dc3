"""The preemption benchmark's hold: a task holds after a chosen step until its preemption signal, within a bound."""

import json
import os
import signal
import threading
import time

import pytest

from tfdist.errors import RunFailed
from tfdist.bench import preemption as hold
from tfdist.bench.preemption import hold_for_signal
from tfdist.runtime.preemption import Preemption


@pytest.fixture
def asked(tmp_path, monkeypatch):
    """Hold after step 4, markers into ``tmp_path``, a bound of 30 s."""
    monkeypatch.setenv(hold.STEP_VARIABLE, "4")
    monkeypatch.setenv(hold.DIRECTORY_VARIABLE, str(tmp_path))
    monkeypatch.setenv(hold.SECONDS_VARIABLE, "30")
    return tmp_path


def test_without_the_variable_or_past_its_step_nothing_holds(tmp_path, monkeypatch):
    monkeypatch.delenv(hold.STEP_VARIABLE, raising=False)
    hold_for_signal(3, 4, None, 1.0)  # no preemption: it would fail if it held
    monkeypatch.setenv(hold.STEP_VARIABLE, "4")
    monkeypatch.setenv(hold.DIRECTORY_VARIABLE, str(tmp_path))
    for begin, end in ((0, 3), (4, 5), (5, 8)):
        hold_for_signal(begin, end, None, 1.0)
    assert list(tmp_path.iterdir()) == []


def test_a_task_holds_after_the_step_until_it_receives_sigterm(asked):
    marker = asked / hold.marker_name("worker:1")
    sent = []

    def signal_once_held():
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # a slow parent: the task must still be there
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    with Preemption("worker:1") as preemption:
        preemption.deferred()
        signaller = threading.Thread(target=signal_once_held)
        signaller.start()
        hold_for_signal(2, 4, preemption, 123.5)  # a chunk of steps 3-4 crosses the step
        released = time.monotonic()
        signaller.join(timeout=30)
    assert sent and released >= sent[0] and preemption.requested
    assert json.loads(marker.read_text()) == {"task": "worker:1", "step": 4, "first_step_at": 123.5}


def test_a_hold_that_never_receives_its_signal_fails_within_its_bound(asked, monkeypatch):
    monkeypatch.setenv(hold.SECONDS_VARIABLE, "0.3")
    began = time.monotonic()
    with Preemption("local") as preemption:
        preemption.deferred()
        with pytest.raises(RunFailed, match=r"local held after step 4 .* for 0.3 s and received no SIGTERM"):
            hold_for_signal(3, 4, preemption, 1.0)
    assert 0.3 <= time.monotonic() - began < 10
    assert (asked / "local.held").exists()


def test_a_hold_in_a_run_that_takes_no_signal_fails_at_once(asked):
    with pytest.raises(RunFailed, match="takes no preemption signal"):
        hold_for_signal(3, 4, None, 1.0)


def test_the_hook_is_installed_only_when_the_environment_asks_and_holds_after_its_chunk(asked, monkeypatch):
    import types

    (hook,) = hold.hold_from_environment()
    run = types.SimpleNamespace(preemption=None, first_step_at=1.0)
    hook.chunk_done(0, 3, run)  # before the step: nothing
    with pytest.raises(RunFailed, match="takes no preemption signal"):
        hook.chunk_done(3, 4, run)
    monkeypatch.delenv(hold.STEP_VARIABLE)
    assert hold.hold_from_environment() == ()
