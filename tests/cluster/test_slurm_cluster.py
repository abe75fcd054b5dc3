"""A real 2-node Slurm on this machine (``tests/helpers/local_slurm.sh``): srun, sbatch and train.sbatch unmodified.

The cluster is Debian's Slurm, each ``slurmd`` in a network namespace of its
own (nodes ``n1`` and ``n2`` at 10.213.0.11 and .12, slurmctld on the bridge
at 10.213.0.1): every task of a job runs on its node's address, as on hosts
of a real cluster. The module brings it up once (unless it was up already)
and takes it down at the end; it is skipped, with the reason, where that
cannot be done (not root, no Slurm and no apt-get, no network namespaces).

All the batch jobs are submitted at once when the module starts (``sbatch
--wait``, each from a submit directory of its own, as a user would with a
checkout on shared storage): two multi-worker jobs on the same two nodes at
the same time, the parameter-server form, a job with a bad flag and one that
is preempted mid-run. Each check then waits for its own job; on 2 cores they
take a few minutes together.
The jobs run this venv's ``python`` (first on PATH, which sbatch hands to the
job) and a tiny experiment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cluster_runs import SHORT
from tfdist.cluster import slurm
from tfdist.errors import USAGE_EXIT_CODE
from helpers.clis import HELPERS, REPO

pytestmark = pytest.mark.slow

LOCAL_SLURM = HELPERS / "local_slurm.sh"
SBATCH = REPO / "configs" / "slurm" / "train.sbatch"
#: A job's longest wait here (every job of the module runs at once on 2 busy cores).
JOB_TIMEOUT_S = 480
#: 4 steps of the shared tiny experiment, a checkpoint every 2.
TINY = [f.replace("steps_per_epoch=6", "steps_per_epoch=4").replace("checkpoint_every=10", "checkpoint_every=2")
        for f in SHORT]

#: Long enough to be preempted mid-run.
LONGER = [f.replace("steps_per_epoch=4", "steps_per_epoch=160").replace("checkpoint_every=2", "checkpoint_every=50")
          for f in TINY]


def _why_not() -> str | None:
    """Why a local Slurm cannot be brought up here, or None."""
    if os.geteuid() != 0:
        return "a local Slurm needs root (tests/helpers/local_slurm.sh makes network namespaces and starts daemons)"
    if not (shutil.which("slurmctld") and shutil.which("slurmd")) and not shutil.which("apt-get"):
        return "Slurm (slurm-wlm, munge) is not installed and there is no apt-get to install it"
    for tool in ("ip", "nsenter"):
        if not shutil.which(tool):
            return f"no `{tool}` here: tests/helpers/local_slurm.sh needs it for the nodes' network namespaces"
    return None


def job_env(**extra: str) -> dict[str, str]:
    """A user's environment for sbatch/srun: this venv's python first on PATH, nothing of pytest's ports."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_PORT_RANGE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def _local_slurm(action: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LOCAL_SLURM), action], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slurm_cluster():
    """The 2-node cluster, up for the module; taken down at the end unless it was up before."""
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    was_up = _local_slurm("status", 30).returncode == 0
    if not was_up:
        try:
            up = _local_slurm("up", 300)
        except subprocess.TimeoutExpired:
            up = subprocess.CompletedProcess([], 1, "", "local_slurm.sh up took more than 300 s")
        if up.returncode != 0:
            _local_slurm("down", 120)
            lines = up.stderr.strip().splitlines() or [f"exit status {up.returncode}"]
            pytest.skip(f"Slurm cannot start here (tests/helpers/local_slurm.sh up): {lines[-1]}")
    yield
    if not was_up:
        down = _local_slurm("down", 120)
        assert down.returncode == 0, down.stderr


class Job:
    """One ``sbatch --wait configs/slurm/train.sbatch`` running in the background, from its own directory."""

    def __init__(self, submit_dir: Path, name: str, sbatch_options: list[str], args: list[str], **env: str):
        self.dir, self.name = submit_dir, name
        submit_dir.mkdir(parents=True)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["sbatch", "--wait", "--parsable", f"--job-name={name}", *sbatch_options, str(SBATCH), *args],
            cwd=submit_dir, env=job_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.status: int | None = None
        self.job_id = ""
        self.stderr = ""
        self.seconds = 0.0

    def wait(self) -> "Job":
        """Wait for the job (bounded; cancelled when it takes too long); ``status`` is sbatch --wait's."""
        if self.status is None:
            try:
                out, self.stderr = self.proc.communicate(timeout=max(1.0, JOB_TIMEOUT_S - self.elapsed()))
            except subprocess.TimeoutExpired:
                subprocess.run(["scancel", f"--name={self.name}"], timeout=30)
                self.proc.kill()
                self.proc.communicate()
                pytest.fail(f"job {self.name} did not end within {JOB_TIMEOUT_S} s:\n{self.log()[-3000:]}")
            self.job_id = out.strip().split(";")[0]
            self.status = self.proc.returncode
            self.seconds = self.elapsed()
        return self

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def log(self) -> str:
        logs = sorted(self.dir.glob(f"{self.name}-*.out"))
        return "".join(p.read_text(errors="replace") for p in logs)

    def run_dir(self) -> Path:
        (run_dir,) = self.dir.glob("runs/*")
        return run_dir

    def show(self) -> dict[str, str]:
        """``scontrol show job`` as a mapping (kept by slurmctld for MinJobAge after the job ends)."""
        out = subprocess.run(["scontrol", "-o", "show", "job", self.job_id], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory) -> dict[str, Job]:
    """Every batch job of the module, submitted together."""
    root = tmp_path_factory.mktemp("slurm_jobs")
    submitted = {
        # two 2-node jobs at once on the same nodes (one task, 4 CPUs, on each node; each node has 32)
        "mwm_a": Job(root / "a", "tfdist-a", [], TINY),
        "mwm_b": Job(root / "b", "tfdist-b", [], TINY),
        "ps": Job(root / "ps", "tfdist-ps", ["--ntasks=4"], TINY,
                  TFDIST_STRATEGY="parameter_server", TFDIST_TASKS="chief=1,worker=2,ps=1"),
        "bad_flag": Job(root / "bad", "tfdist-bad", [], [*TINY, "--epochs=0"]),
        # preempted mid-run by the test (the time limit's SIGUSR1), requeued by the script, resumed
        "requeue": Job(root / "requeue", "tfdist-rq", [], [*LONGER, "--log_every=5"]),
    }
    yield submitted
    for job in submitted.values():
        if job.status is None:
            job.proc.kill()
            subprocess.run(["scancel", f"--name={job.name}"], timeout=30)


def _tf_configs(log: str) -> dict[int, dict]:
    """Rank -> TF_CONFIG of the ``srun --label ... tfdist.tfconfig`` lines of a log."""
    found = {}
    for line in log.splitlines():
        match = re.fullmatch(r"\s*([0-9]+): (\{.*\})", line)
        if match:
            found[int(match.group(1))] = json.loads(match.group(2))
    return found


def _assert_trained(job: Job, strategy: str) -> None:
    assert job.status == 0, f"{job.name}: sbatch --wait exited {job.status}\n{job.stderr}\n{job.log()[-3000:]}"
    run_dir = job.run_dir()
    assert re.fullmatch(rf"{job.name}-{job.job_id}-[0-9]{{8}}T[0-9]{{6}}Z", run_dir.name)  # names the job
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["strategy"] == strategy and summary["steps"] == 4
    assert (run_dir / "params.yaml").is_file() and list((run_dir / "checkpoints").iterdir())
    assert job.show()["ExitCode"] == "0:0"
    assert not list(job.dir.glob(".tfdist-job-*"))  # the status file went with the job


def check_srun_tfconfig_gives_each_task_its_own_tf_config(jobs):
    proc = subprocess.run(
        ["srun", "--nodes=2", "--ntasks=2", "--label", "bash", "-c",
         'echo "job $SLURM_JOB_ID" >&2; exec python -m tfdist.tfconfig --cluster slurm'],
        env=job_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = re.search(r"job ([0-9]+)", proc.stderr).group(1)
    port = slurm.job_port_base({"SLURM_JOB_ID": job_id})
    expected = {"worker": [f"n1:{port}", f"n2:{port}"]}  # each task at its own node's address
    assert _tf_configs(proc.stdout) == {
        0: {"cluster": expected, "task": {"type": "worker", "index": 0}},
        1: {"cluster": expected, "task": {"type": "worker", "index": 1}},
    }


def check_two_multi_worker_jobs_at_once_on_the_same_nodes(jobs):
    a, b = jobs["mwm_a"].wait(), jobs["mwm_b"].wait()
    for job in (a, b):
        _assert_trained(job, "multi_worker_mirrored")
    shown = {job.name: job.show() for job in (a, b)}
    assert {s["NodeList"] for s in shown.values()} == {"n[1-2]"}
    times = {name: (s["StartTime"], s["EndTime"]) for name, s in shown.items()}
    (a_start, a_end), (b_start, b_end) = times[a.name], times[b.name]
    assert a_start < b_end and b_start < a_end, times  # they ran at the same time
    ports = [{address for c in _tf_configs(job.log()).values() for address in c["cluster"]["worker"]}
             for job in (a, b)]
    assert len(ports[0]) == len(ports[1]) == 2 and not ports[0] & ports[1], ports  # no port shared


def check_parameter_server_job(jobs):
    job = jobs["ps"].wait()
    _assert_trained(job, "parameter_server")
    configs = _tf_configs(job.log())
    assert sorted(c["task"]["type"] for c in configs.values()) == ["chief", "ps", "worker", "worker"]


def check_a_bad_flag_is_the_jobs_exit_code_2(jobs):
    job = jobs["bad_flag"].wait()
    log = job.log()
    assert job.status == USAGE_EXIT_CODE, f"sbatch --wait exited {job.status}\n{log[-3000:]}"
    assert job.show()["ExitCode"] == f"{USAGE_EXIT_CODE}:0"
    assert "Invalid value for `--epochs`" in log and "Traceback" not in log
    assert not list(job.dir.glob("runs/*/checkpoints/*"))  # nothing trained


def check_a_job_that_can_never_start_is_refused_by_test_only(jobs, tmp_path):
    # The 2-node script on the 1-node partition "one": sbatch alone would queue it for ever (PartitionNodeLimit).
    proc = subprocess.run(["sbatch", "--test-only", "--partition=one", str(SBATCH)], cwd=tmp_path, env=job_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Requested node configuration is not available" in proc.stderr, proc.stderr
    fits = subprocess.run(["sbatch", "--test-only", str(SBATCH)], cwd=tmp_path, env=job_env(),
                          capture_output=True, text=True, timeout=60)
    assert fits.returncode == 0 and "to start at" in fits.stderr, fits.stderr


def check_a_preempted_job_is_requeued_and_resumes_its_own_run(jobs):
    job = jobs["requeue"]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while "train  step" not in job.log():  # training has started: checkpoints can be written
        assert job.proc.poll() is None and time.monotonic() < deadline, job.log()[-3000:]
        time.sleep(2)
    job_id = subprocess.run(["squeue", "-h", f"--name={job.name}", "-o", "%i"], capture_output=True, text=True,
                            timeout=30, check=True).stdout.strip()
    # What Slurm sends 90 s before the time limit (#SBATCH --signal=USR1@90): every task of the steps.
    subprocess.run(["scancel", "--signal=USR1", job_id], timeout=30, check=True)
    job.wait()
    log = job.log()
    assert job.status == 0, f"sbatch --wait exited {job.status}\n{log[-3000:]}"
    (run_dir,) = job.dir.glob("runs/*")  # one run directory over both starts
    assert f"requeueing job {job_id}" in log and f"job {job_id} (start 2): run directory {run_dir.relative_to(job.dir)}" in log
    assert re.search(rf"resuming from {re.escape(str(run_dir.relative_to(job.dir)))}/checkpoints/ckpt-[0-9]+ at step [1-9]", log)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 160
    assert job.show()["Restarts"] == "1"


#: Each check, in the order they run (the srun and --test-only ones while the batch jobs run).
CHECKS = [
    check_srun_tfconfig_gives_each_task_its_own_tf_config,
    check_a_job_that_can_never_start_is_refused_by_test_only,
    check_a_preempted_job_is_requeued_and_resumes_its_own_run,  # before it ends by itself
    check_a_bad_flag_is_the_jobs_exit_code_2,
    check_two_multi_worker_jobs_at_once_on_the_same_nodes,
    check_parameter_server_job,
]


def test_train_sbatch_on_a_two_node_slurm(jobs, tmp_path):
    """Every check above, in one test: the cluster and its jobs belong to one pytest worker (pytest-xdist's
    loadgroup does not keep a module's tests together with pytest 9 here), and a failed check does not stop
    the others."""
    failed = {}
    for check in CHECKS:
        try:
            check(jobs, tmp_path) if check is check_a_job_that_can_never_start_is_refused_by_test_only else check(jobs)
        except (AssertionError, pytest.fail.Exception) as e:
            failed[check.__name__] = str(e)
    assert not failed, "\n\n".join(f"{name}: {why}" for name, why in failed.items())
