"""The progress watchdog (``--progress_timeout``): real runs that stop making progress end with one line naming who.

- multi_worker_mirrored, 2 workers started by hand on 127.0.0.1: worker 1's
  input pipeline stops after 6 batches (``tests/stalled_input.py``); both
  workers end with status 4 within the timeout plus 30 s, each names worker:1
  as reading input, and each log holds its Python stacks.
- the same with worker 1 stopped by SIGSTOP: worker 0 ends with status 4 and
  names worker:1 as a task whose heartbeat stopped, whether its watchdog or
  TensorFlow's coordination service ends it first (``--progress_timeout`` 6
  and 9 s).
- one process whose input stops: it says that it is reading input.
- ``describe`` itself on heartbeats made by hand: who is behind and how it is said.
- the deadline itself, on a clock of the test's own: the first chunk of a run,
  from step 0 or resumed at a later step, gets the first-chunk allowance
  (tracing and compiling); every chunk after it gets ``--progress_timeout``.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
import types

import pytest

from cluster_runs import EXPERIMENT, REPO, Processes, loopback_cluster, train_command, train_steps_logged
from tfdist.errors import PEER_LOST_EXIT_CODE
from tfdist.runtime import watchdog as watchdog_module
from tfdist.runtime.watchdog import Watchdog, describe, heartbeat_name, stopped_tasks

TIMEOUT_S = 6
#: Long enough not to end before the stall, with log lines each step so the tests see where it is.
FLAGS = [*[f.replace("steps_per_epoch=40", "steps_per_epoch=200") for f in EXPERIMENT], "--log_every=1",
         "--checkpoint_every=1000", "--noexport", f"--progress_timeout={TIMEOUT_S}"]
STALLED = [sys.executable, str(REPO / "tests" / "stalled_input.py")]


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def _record(phase="training", step=6, fed=7, age=0.5, now=1000.0):
    return {"task": "x", "time": now - age, "phase": phase, "step": step, "fed": fed}


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


def test_a_lost_peer_line_names_the_peers_whose_heartbeat_stopped(tmp_path):
    """``roles.peer_errors`` adds these to its line: a frozen peer still accepts connections."""
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


def _stall_run(tmp_path, *, stop_worker_1: bool, timeout: int = TIMEOUT_S):
    """Two workers; worker 1 either reads an input that stops after 6 batches, or is stopped (SIGSTOP) at step 6."""
    flags = [f"--progress_timeout={timeout}" if f.startswith("--progress_timeout=") else f for f in FLAGS]
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    model_dir = tmp_path / "run"
    with Processes(tmp_path) as procs:
        workers = []
        for i in (0, 1):
            head = STALLED + ["6"] if i == 1 and not stop_worker_1 else train_command()
            workers.append(procs.start(f"worker-{i}", [*head, f"--cluster={cluster}", f"--task=worker:{i}",
                                                       "--strategy=multi_worker_mirrored", *flags,
                                                       f"--model_dir={model_dir}"]))
        workers[0].wait_for(lambda _: 6 in train_steps_logged(model_dir), 240, "step 6")
        if stop_worker_1:
            workers[1].kill(signal.SIGSTOP)
        stalled_at = time.monotonic()
        status = workers[0].wait(timeout + 30)
        ended_after = time.monotonic() - stalled_at
        other = None if stop_worker_1 else workers[1].wait(30)
        workers[1].kill()
    return status, other, ended_after, [w.text() for w in workers]


def test_a_worker_whose_input_stalls_is_named_by_every_worker_and_both_log_their_stacks(tmp_path):
    status, other, ended_after, texts = _stall_run(tmp_path, stop_worker_1=False)
    assert (status, other) == (PEER_LOST_EXIT_CODE, PEER_LOST_EXIT_CODE), texts[0][-3000:]
    assert ended_after < TIMEOUT_S + 30
    for i, text in enumerate(texts):
        line = last_line(text)
        assert line.startswith("error: No progress for ") and f"(this is worker:{i})" in line, line
        assert "worker:1 is behind, reading input" in line and "worker:0 waits for it in a collective" in line, line
        assert "worker:0 is behind" not in line
        assert "the Python stacks of its threads:" in text and "most recent call first" in text
        assert "Traceback" not in text


@pytest.mark.parametrize("timeout", [TIMEOUT_S, 9])
def test_a_stopped_worker_is_named_by_the_one_that_waits_for_it(tmp_path, timeout):
    """Two endings race, both right: worker 0's watchdog (--progress_timeout) or TensorFlow's coordination
    service (heartbeat timeout 10 s, heartbeats every 5 s) may end worker 0 first; each line names worker:1.

    Measured here: the service ends it about 7.5 s after the SIGSTOP, so at 6 s the watchdog is first as a
    rule and at 9 s the service (3 runs of 3), whose line names worker:1 by its heartbeat (0.9 s interval).
    """
    status, _, ended_after, texts = _stall_run(tmp_path, stop_worker_1=True, timeout=timeout)
    assert status == PEER_LOST_EXIT_CODE, texts[0][-3000:]
    assert ended_after < timeout + 30
    line = last_line(texts[0])
    if line.startswith("error: No progress for "):  # the watchdog first
        assert "(this is worker:0): worker:1 is behind: it has not written its heartbeat for " in line, line
        assert "(the process is stopped or frozen, or its host is down)" in line
        assert "most recent call first" in texts[0]
    else:  # TensorFlow's heartbeat timeout first: the lost-peer line names worker:1 by its tfdist heartbeat
        assert line.startswith("error: Lost a task of the multi_worker_mirrored cluster, or it stopped answering "
                               "(this is worker:0): worker:1 (no heartbeat for "), line
        assert " s: stopped or frozen); " in line, line
        assert re.search(r"Received: (Unavailable|Aborted|Cancelled|DeadlineExceeded)Error from TensorFlow", line), line


def test_one_process_whose_input_stalls_says_it_is_reading_input(tmp_path):
    model_dir = tmp_path / "run"
    with Processes(tmp_path) as procs:
        proc = procs.start("local", [*STALLED, "4", "--strategy=one_device", *FLAGS, f"--model_dir={model_dir}"])
        status = proc.wait(240)
    text = proc.text()
    assert status == PEER_LOST_EXIT_CODE, text[-3000:]
    assert last_line(text).endswith("at step 4 of 200 (this is local): it is reading input (its batch for step 5 "
                                    "has not come from its input pipeline). Its Python stacks are in its log."), text
    assert (model_dir / "heartbeats" / "local.json").is_file()  # kept: the run did not end well
