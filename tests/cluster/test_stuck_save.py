"""A worker's save waits for the chief's matching save no longer than the progress timeout: with the chief alive
but stuck inside that save, the worker ends with one line naming the save and status 4 (a peer making no
progress), long before the chief would have finished.
"""

from __future__ import annotations

import sys
import time

import pytest

from helpers.clis import HELPERS
from helpers.cluster_runs import Processes, launcher, loopback_cluster

pytestmark = pytest.mark.slow

#: How long the chief is stuck in its save: far past the worker's progress timeout (5 s) and this test's wait.
STUCK_SECONDS = 600


def test_a_save_waiting_for_a_stuck_chief_ends_at_the_progress_timeout_with_one_line(tmp_path):
    out = tmp_path / "saves"
    out.mkdir()
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(HELPERS / "script_stuck_save.py"),
                                              str(out), str(STUCK_SECONDS)))
        started = time.monotonic()
        status = proc.wait(240)
        seconds, text = time.monotonic() - started, proc.text()
    worker = [line[len("[worker:1] "):] for line in text.splitlines() if line.startswith("[worker:1] ")]
    errors = [line for line in worker if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(worker), text[-5000:]
    assert errors[0].startswith("error: No progress for ") and "(progress_timeout 5) in the save of " \
        f"{out / 'stuck.keras'} at script_stuck_save.py:" in errors[0], errors
    assert "the chief is alive but began that save and has not finished it" in errors[0], errors
    assert "[launch] worker:1 exited with status 4" in text, text[-5000:]
    assert status == 4 and seconds < STUCK_SECONDS / 2, (status, seconds, text[-3000:])
    assert "SAVED" not in text, text[-3000:]
