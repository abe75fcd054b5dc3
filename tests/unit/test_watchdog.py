"""The progress watchdog's pure parts: what a stall line says, stale heartbeats, the first step's allowance."""

from __future__ import annotations

import json
import time
import types

import pytest

from tfdist.runtime import watchdog as watchdog_module
from tfdist.runtime.watchdog import Watchdog, describe, heartbeat_name, stopped_tasks


def _record(phase="training", step=6, fed=7, age=0.5, now=1000.0, until=None):
    return {"task": "x", "time": now - age, "phase": phase, "step": step, "fed": fed, "until": until}


def test_describe_names_the_task_behind_and_what_it_does():
    stalled = describe({"worker:0": _record(fed=7), "worker:1": _record(fed=6)}, me="worker:0", now=1000.0,
                       stale_after=3, idle=8, step=6, total_steps=200)
    assert stalled.startswith("No progress for 8 s (--progress_timeout) at step 6 of 200 (this is worker:0): ")
    assert "worker:1 is behind, reading input (its batch for step 7 has not come from its input pipeline)" in stalled
    assert "worker:0 waits for it in a collective" in stalled
    # Inside a chunk of several steps both have fed past step 6; the one that has fed fewer waits for input.
    ahead = describe({"worker:0": _record(fed=8), "worker:1": _record(fed=7)}, me="worker:0", now=1000.0,
                     stale_after=3, idle=8, step=6, total_steps=200)
    assert "worker:1 is behind, reading input (its batch for step 8 has not come" in ahead, ahead
    assert "worker:0 is behind" not in ahead
    stopped = describe({"worker:0": _record(fed=7), "worker:1": _record(age=20)}, me="worker:0", now=1000.0,
                       stale_after=3, idle=8, step=6, total_steps=200)
    assert "worker:1 is behind: it has not written its heartbeat for 20 s (the process is stopped or frozen" in stopped
    saving = describe({"chief:0": _record(phase="checkpointing", fed=6), "worker:0": _record(fed=7)}, me="worker:0",
                      now=1000.0, stale_after=3, idle=8, step=6, total_steps=200)
    assert "chief:0 is behind, checkpointing (step 6)" in saving and "worker:0 waits for it" in saving
    never = describe({"worker:0": _record(), "worker:1": None}, me="worker:0", now=1000.0, stale_after=3, idle=8,
                     step=6, total_steps=200)
    assert "worker:1 is behind: it has written no heartbeat" in never
    even = describe({"worker:0": _record(fed=7), "worker:1": _record(fed=7)}, me="worker:0", now=1000.0,
                    stale_after=3, idle=8, step=6, total_steps=200)
    assert "no task is behind the others" in even and "worker:1 is waiting for a collective" in even


def test_inside_a_chunk_of_several_steps_an_input_that_has_not_fed_it_is_what_waits():
    """Steps 6 to 12 in one chunk (``until`` 12): the input fed 9 of them."""
    alone = describe({"local": _record(fed=9, until=12)}, me="local", now=1000.0, stale_after=3, idle=8, step=6,
                     total_steps=200)
    assert alone.endswith("it is reading input (its batch for step 10 has not come from its input pipeline). "
                          "Its Python stacks are in its log."), alone
    fed = describe({"local": _record(fed=12, until=12)}, me="local", now=1000.0, stale_after=3, idle=8, step=6,
                   total_steps=200)
    assert "it is waiting for a collective" in fed, fed
    two = describe({"worker:0": _record(fed=10, until=12), "worker:1": _record(fed=9, until=12)}, me="worker:0",
                   now=1000.0, stale_after=3, idle=8, step=6, total_steps=200)
    assert "worker:1 is behind, reading input (its batch for step 10" in two and "worker:0 waits for it" in two, two
    both = describe({"worker:0": _record(fed=9, until=12), "worker:1": _record(fed=9, until=12)}, me="worker:0",
                    now=1000.0, stale_after=3, idle=8, step=6, total_steps=200)
    assert "worker:0 is behind, reading input" in both and "worker:1 is behind, reading input" in both, both


def test_a_lost_peer_line_names_the_peers_whose_heartbeat_stopped(tmp_path):
    """``runtime.lifecycle.among_peers`` adds these to its line: a frozen peer still accepts connections."""
    for task, age in (("worker:0", 1), ("worker:1", 30)):
        (tmp_path / heartbeat_name(task)).write_text(json.dumps(_record(age=age)))
    assert stopped_tasks(tmp_path, ["worker:0", "worker:1", "worker:2"], now=1000.0) == [
        "worker:1 (no heartbeat for 30 s: stopped or frozen)"]


def test_a_heartbeat_is_stale_by_the_interval_its_task_writes_at(tmp_path):
    # 5 s old: stale for a task that writes every 0.6 s (--progress_timeout 6: after 3.8 s), not for one that
    # writes every 2 s (after 8 s), nor for a record without its interval (MAX_INTERVAL, 2 s).
    records = {"worker:0": {**_record(age=5), "interval": 0.6}, "worker:1": {**_record(age=5), "interval": 2.0},
               "worker:2": _record(age=5)}
    for task, record in records.items():
        (tmp_path / heartbeat_name(task)).write_text(json.dumps(record))
    assert stopped_tasks(tmp_path, list(records), now=1000.0) == ["worker:0 (no heartbeat for 5 s: stopped or frozen)"]


class _OneLook:
    """Stands in for the watchdog thread's stop event: its wait returns once, as after one interval, then stops it."""

    def __init__(self):
        self.looked = False

    def wait(self, _seconds):
        done, self.looked = self.looked, True
        return done


@pytest.mark.parametrize("start_step", [0, 500], ids=["fresh", "resumed"])
def test_the_first_chunk_of_a_fresh_or_resumed_run_gets_the_first_step_allowance(tmp_path, monkeypatch, start_step):
    """One look of the watchdog thread after a given idle time, on the test's clock: does it end the run?"""
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(watchdog_module, "time", types.SimpleNamespace(monotonic=lambda: clock.now, time=time.time))
    timeout = 60
    allowance = max(watchdog_module.FIRST_STEP_FACTOR * timeout, watchdog_module.FIRST_STEP_SECONDS)
    assert allowance > timeout + 60
    dog = Watchdog(task="local", tasks=["local"], directory=tmp_path, timeout=timeout, step=start_step,
                   total_steps=start_step + 100)
    fired = []
    monkeypatch.setattr(dog, "_fire", fired.append)

    def ends_after(idle: float) -> bool:
        fired.clear()
        clock.now = dog.progress_at + idle
        dog._stop = _OneLook()
        dog._watch()
        return bool(fired)

    dog.doing("first_step")  # the first chunk: tracing, compiling, the first batch
    assert not ends_after(timeout + 30) and not ends_after(allowance - 5)
    assert ends_after(allowance + 5)
    dog.progress(start_step + 10)  # the first chunk ended; every later chunk gets --progress_timeout
    dog.doing("training")
    assert not ends_after(timeout - 5) and ends_after(timeout + 5)

