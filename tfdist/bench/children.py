"""The parent's side of the benchmark's child processes: start them, wait for them, read their rows.

A job runs in one child, or in a cluster of them (one
``multi_worker_mirrored`` worker task each, gRPC on 127.0.0.1). Each child is
``python -m tfdist.bench --child JOB`` and answers one ``Measured`` line per
row on stdout. Waits are bounded, and a failed child ends its peers at once,
since they would wait for it.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

from tfdist.bench.rows import RESULT_PREFIX, ChildJob, Job, Measured, RowSpec
from tfdist.cluster.network import free_ports
from tfdist.cluster.spec import parse_cluster_spec
from tfdist.cluster.task import Task


def _parse_child_output(stdout: str) -> list[Measured]:
    results = [Measured.from_line(line) for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not results:
        raise RuntimeError("the benchmark child printed no result")
    return results


def _spawn(rows: Sequence[RowSpec], env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start a benchmark child on ``rows`` (``env``: a cluster task's TF_CONFIG, else none)."""
    child_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    if env is None:
        child_env.pop("TF_CONFIG", None)
    job = ChildJob(rows=tuple(rows), spawned_at=time.time())
    return _start([sys.executable, "-m", "tfdist.bench", "--child", job.to_json()], child_env)


def _start(argv: list[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start ``argv`` with its stdout and stderr in temporary files (``proc.outputs``).

    Files, not pipes: a child that filled a pipe (64 KB) nobody was reading
    yet would block, and its cluster peers with it.
    """
    outputs = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
    proc = subprocess.Popen(argv, stdout=outputs[0], stderr=outputs[1], text=True, env=env)
    proc.outputs = outputs
    return proc


def _read(file) -> str:
    file.seek(0)
    return file.read()


def _collect(processes: list[subprocess.Popen], timeout: float = 900) -> list[list[Measured]]:
    """Each process's results (bounded wait); on a failure or time-out kill all and raise."""
    deadline = time.time() + timeout
    try:
        # Until all are done, one has failed (its peers would wait for it) or the time is up.
        statuses = [p.poll() for p in processes]
        while None in statuses and not any(statuses):
            if time.time() > deadline:
                raise RuntimeError(f"benchmark children still running after {timeout:g} s")
            time.sleep(0.2)
            statuses = [p.poll() for p in processes]
        outputs = [tuple(_read(f) for f in proc.outputs) for proc in processes]
        for proc, (_, stderr) in zip(processes, outputs):
            if proc.returncode:
                raise RuntimeError(f"benchmark child failed ({proc.returncode}): {stderr.strip()[-1500:]}")
        return [_parse_child_output(stdout) for stdout, _ in outputs]
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            for f in proc.outputs:
                f.close()


def combine(job: Job, per_process: Sequence[Sequence[Measured]]) -> list[Measured]:
    """One result per row from each process's: worker 0's figures, the peak memory summed over the processes."""
    return [dataclasses.replace(row, repeat=job.repeat, processes=len(per_process),
                                peak_rss_mb=sum(results[i].peak_rss_mb for results in per_process))
            for i, row in enumerate(per_process[0])]


def launch(job: Job) -> list[Measured]:
    """Run one job's rows in ``job.processes`` processes (a cluster's worker tasks when several); ``combine``d."""
    if job.processes == 1:
        return combine(job, _collect([_spawn(job.rows)]))
    spec = parse_cluster_spec({"worker": [f"127.0.0.1:{p}" for p in free_ports(job.processes)]}, source="bench")
    tasks = [Task(spec=spec, type="worker", index=i) for i in range(job.processes)]
    return combine(job, _collect([_spawn(job.rows, {"TF_CONFIG": task.tf_config_json()}) for task in tasks]))
