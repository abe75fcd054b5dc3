"""The progress watchdog (``--progress_timeout``): real runs that stop making progress end with one line naming who.

- multi_worker_mirrored, 2 workers started by hand on 127.0.0.1: worker 1's
  input pipeline stops after 6 batches (``tests/helpers/stalled_input.py``); both
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

import re
import signal
import sys
import time

import pytest

from helpers.clis import HELPERS
from helpers.cluster_runs import EXPERIMENT, Processes, loopback_cluster, train_command, train_steps_logged
from tfdist.errors import PEER_LOST_EXIT_CODE
from helpers.outputs import last_line

TIMEOUT_S = 6
#: Long enough not to end before the stall, with log lines each step so the tests see where it is.
FLAGS = [*[f.replace("steps_per_epoch=40", "steps_per_epoch=200") for f in EXPERIMENT], "--log_every=1",
         "--checkpoint_every=1000", f"--progress_timeout={TIMEOUT_S}"]
STALLED = [sys.executable, str(HELPERS / "stalled_input.py")]


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
