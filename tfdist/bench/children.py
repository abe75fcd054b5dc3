"""The parent's side of the benchmark's child processes: measurement children started, waited for (bounded) and
read, and real ``python -m tfdist.train`` runs, alone or under ``tfdist.launch --local``, started, signalled and
read without importing TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from tfdist.bench.rows import RESULT_PREFIX, ChildJob, Job, Measured
from tfdist.cluster.network import free_ports
from tfdist.cluster.spec import parse_cluster_spec
from tfdist.cluster.task import Task


def _parse_child_output(stdout: str) -> list[Measured]:
    results = [Measured.from_line(line) for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not results:
        raise RuntimeError("the benchmark child printed no result")
    return results


#: How many times in all a cluster is run when TensorFlow's profiler crashes as it stops (it can corrupt its own
#: heap in ``tf.profiler.experimental.stop``; nothing in the step causes it).
PROFILER_ATTEMPTS = 5

#: The Python frame that ``faulthandler`` prints for a crash inside ``tf.profiler.experimental.stop``.
_PROFILER_STOP_FRAME = re.compile(r'profiler_v2\.py", line \d+ in stop\b')


class ProfilerCrashed(RuntimeError):
    """A child died of TensorFlow's profiler crash (``profiler_crashed``): the run may be made again."""


def profiler_crashed(returncode: int | None, stderr: str) -> bool:
    """Whether a child died (SIGABRT or SIGSEGV) inside ``tf.profiler.experimental.stop``, by its stack on stderr."""
    return returncode in (-signal.SIGABRT, -signal.SIGSEGV) and bool(_PROFILER_STOP_FRAME.search(stderr))


def _env(tf_config: str | None) -> dict[str, str]:
    """A child's environment: TensorFlow's info lines off, a Python stack on a crash, and its TF_CONFIG or none.

    ``TFDIST_TF_LOGS=1`` keeps ``tfdist.quiet``'s forwarder out of the child,
    so that a crash's stack is in the child's stderr file when the child has
    died, not still on its way through the forwarder.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONFAULTHANDLER": "1", "TFDIST_TF_LOGS": "1"}
    env.pop("TF_CONFIG", None)
    return env if tf_config is None else {**env, "TF_CONFIG": tf_config}


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
        # The profiler's crash first: a peer of the crashed child may have failed after it, for want of it.
        for proc, (_, stderr) in zip(processes, outputs):
            if profiler_crashed(proc.returncode, stderr):
                raise ProfilerCrashed(f"benchmark child died in TensorFlow's profiler ({proc.returncode})")
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
    """One result per row from each process's: worker 0's figures, the peak memory and the CPU time per step
    summed over the processes."""
    def total(i: int, field: str) -> float | None:
        values = [getattr(results[i], field) for results in per_process]
        return None if None in values else sum(values)

    return [dataclasses.replace(row, repeat=job.repeat, processes=len(per_process), peak_rss_mb=total(i, "peak_rss_mb"),
                                cpu_seconds_per_step=total(i, "cpu_seconds_per_step"))
            for i, row in enumerate(per_process[0])]


def run_cluster(command: Callable[[], Sequence[str]], processes: int, *, timeout: float = 900,
                attempts: int = PROFILER_ATTEMPTS, log: Callable[[str], None] = print) -> list[list[Measured]]:
    """Run ``command()`` in ``processes`` children, each one worker task of a cluster on 127.0.0.1 when several.

    Returns each child's ``Measured`` lines, in task order. A run whose child
    died of the profiler's crash (``ProfilerCrashed``) is made again, on
    fresh ports and with a fresh ``command()``, up to ``attempts`` runs in
    all, each retry logged; any other failure raises at once
    (``RuntimeError``).
    """
    attempt = 1
    while True:
        if processes == 1:
            envs = [_env(None)]
        else:
            spec = parse_cluster_spec({"worker": [f"127.0.0.1:{p}" for p in free_ports(processes)]}, source="bench")
            envs = [_env(Task(spec=spec, type="worker", index=i).tf_config_json()) for i in range(processes)]
        try:
            return _collect([_start(list(command()), env) for env in envs], timeout=timeout)
        except ProfilerCrashed as e:
            if attempt >= attempts:
                raise
            attempt += 1
            log(f"bench: {e}; running it again ({attempt} of at most {attempts})")


def launch(job: Job, log: Callable[[str], None] = print) -> list[Measured]:
    """Run one job's rows in ``job.processes`` processes (a cluster's worker tasks when several); ``combine``d."""
    def command() -> list[str]:
        child = ChildJob(rows=tuple(job.rows), spawned_at=time.time())
        return [sys.executable, "-m", "tfdist.bench", "--child", child.to_json()]

    return combine(job, run_cluster(command, job.processes, log=log))


#: How often a parent looks at a run's ``metrics.jsonl`` and its processes.
POLL_SECONDS = 0.05


def rows(metrics: Path, split: str) -> list[dict]:
    """The rows of ``split`` (``"train"``, ``"eval"``) in a run's ``metrics.jsonl`` so far.

    The run appends while the parent reads, so a last line being written (not yet JSON) is skipped; a file not
    yet there has no rows.
    """
    try:
        lines = metrics.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("split") == split:
            out.append(row)
    return out


def train_command(flags: Sequence[str], directory: Path, cluster: Mapping[str, int] | None = None, *,
                  module: str = "tfdist.train") -> list[str]:
    """``python -m tfdist.train FLAGS``; under the launcher when ``cluster`` gives task counts (e.g. ``{"worker": 2}``).

    The cluster file is written into ``directory``, every task on a free port of 127.0.0.1. ``module``: another
    module that runs ``tfdist.train``'s command (the preemption benchmark's, which holds for its signal).
    """
    train = [sys.executable, "-m", module, *flags]
    if not cluster:
        return train
    ports = iter(free_ports(sum(cluster.values())))
    lines = [f"{job}: [" + ", ".join(f"127.0.0.1:{next(ports)}" for _ in range(count)) + "]"
             for job, count in cluster.items()]
    path = directory / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return [sys.executable, "-m", "tfdist.launch", f"--cluster={path}", "--local", "--", *train]


class Process:
    """A started command: its own session (its group is killed by ``kill``), its output in files of ``directory``.

    Args:
      argv: the command.
      directory: where its stdout/stderr files go (and its TMPDIR: scratch files go with the directory).
      name: the files' stem.
      label: how errors name the measurement (``"preemption benchmark"``).
      env: variables added to its environment (e.g. the preemption benchmark's hold), or None.
    """

    def __init__(self, argv: list[str], directory: Path, name: str, label: str = "preemption benchmark",
                 env: Mapping[str, str] | None = None):
        import time

        env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **(env or {})}
        env.update(TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(directory))
        self.label = label
        self.out, self.err = directory / f"{name}.out", directory / f"{name}.err"
        self.started_at = time.time()
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)

    def text(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def wait(self, timeout: float, what: str) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self.label}: no {what} after {timeout:g} s: {self.text()[-1500:]}") from None

    def kill(self) -> None:
        """SIGKILL to the process's group, if it is still running; then reap it."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(timeout=30)
