"""``--cluster slurm``: the cluster of a faked 2-node Slurm step, every task's TF_CONFIG, errors, the sbatch script.

A Slurm step is faked the way ``srun`` starts its tasks: the ``SLURM_*``
variables that ``tfdist.cluster.slurm`` and TensorFlow's ``SlurmClusterResolver``
read (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURMD_NODENAME``,
``SLURM_STEP_NODELIST``, ``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_STEP_NUM_TASKS``,
``SLURM_STEP_NUM_NODES``; or the job's, outside ``srun``) and a stand-in
``scontrol`` on ``PATH`` that expands ``scontrol show hostnames NODELIST``.
Library calls get the environment as a mapping (nothing of this process's
environment changes); the CLI runs as real subprocesses, started together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.clis import assert_user_error, run_cli, start_cli
from tfdist import cluster
from tfdist.segmentation import config
from tfdist.cluster import slurm
from tfdist.errors import (DIVERGED_EXIT_CODE, DONE_EXIT_CODE, PEER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE,
                           USAGE_EXIT_CODE, UserError)
from helpers.clis import REPO

SBATCH = REPO / "configs" / "slurm" / "train.sbatch"

# Expands one bracket group per comma-separated part, as `scontrol show hostnames` does:
# node[1-2],gpu[01-02]-ib,login -> node1 node2 gpu01-ib gpu02-ib login (one per line).
FAKE_SCONTROL = r'''
import re, sys
args = sys.argv[1:]
if len(args) != 3 or args[:2] != ["show", "hostnames"]:
    sys.exit("scontrol: error: this stand-in only knows `show hostnames NODELIST`")
parts, depth, current = [], 0, ""
for c in args[2]:
    depth += (c == "[") - (c == "]")
    if c == "," and depth == 0:
        parts.append(current); current = ""
    else:
        current += c
parts.append(current)
for part in parts:
    match = re.fullmatch(r"([^\[\]]*)(?:\[([0-9,-]+)\]([^\[\]]*))?", part)
    if not part or match is None:
        sys.exit(f"scontrol: error: Invalid hostlist: {args[2]}")
    prefix, ranges, suffix = match.groups()
    if ranges is None:
        print(prefix); continue
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        for i in range(int(low), int(high or low) + 1):
            print(f"{prefix}{str(i).zfill(len(low))}{suffix}")
'''


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    """A directory with the stand-in ``scontrol``, to put first on ``PATH``."""
    path = tmp_path_factory.mktemp("slurm_bin")
    scontrol = path / "scontrol"
    scontrol.write_text(f"#!{sys.executable}\n{FAKE_SCONTROL}")
    scontrol.chmod(0o755)
    return path


@dataclasses.dataclass(frozen=True)
class Step:
    """A faked Slurm job step: its node list, tasks per node and where each rank runs."""

    nodelist: str
    hosts: tuple[str, ...]  # what scontrol expands nodelist to
    tasks_per_node: str
    counts: tuple[int, ...]
    cyclic: bool = False  # ranks dealt round-robin over the nodes (srun --distribution=cyclic)

    @property
    def num_tasks(self) -> int:
        return sum(self.counts)

    def placement(self) -> list[tuple[str, int]]:
        """(node, SLURM_LOCALID) of every rank, as srun places them."""
        if not self.cyclic:
            return [(h, i) for h, n in zip(self.hosts, self.counts) for i in range(n)]
        placed, left = [], list(self.counts)
        while any(left):
            for k, host in enumerate(self.hosts):
                if left[k]:
                    placed.append((host, self.counts[k] - left[k]))
                    left[k] -= 1
        return placed

    def environ(self, rank: int, bin_dir: Path, **changes: str | None) -> dict[str, str]:
        """The environment srun gives ``rank``; ``changes`` set (or, with None, remove) variables."""
        node, local_id = self.placement()[rank]
        env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": self.nodelist,
            "SLURM_JOB_NUM_NODES": str(len(self.hosts)),
            "SLURM_NTASKS": str(self.num_tasks),
            "SLURM_TASKS_PER_NODE": self.tasks_per_node,
            "SLURM_STEP_NODELIST": self.nodelist,
            "SLURM_STEP_NUM_NODES": str(len(self.hosts)),
            "SLURM_STEP_NUM_TASKS": str(self.num_tasks),
            "SLURM_STEP_TASKS_PER_NODE": self.tasks_per_node,
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(local_id),
            "SLURMD_NODENAME": node,
        }
        env.update(changes)
        return {k: v for k, v in env.items() if v is not None}


#: The ports of job 4242's tasks on a node start here: 8888 + (4242 % 1000) * 16.
JOB_PORT_BASE = 12760

TWO_BY_TWO = Step("node[1-2]", ("node1", "node2"), "2(x2)", (2, 2))

#: name -> (step, --slurm_tasks, the cluster every task must see).
CASES = {
    "chief_workers_ps": (
        TWO_BY_TWO, "chief=1,worker=2,ps=1",
        {"chief": ["node1:12760"], "worker": ["node2:12760", "node2:12761"], "ps": ["node1:12761"]},
    ),
    # By name node10 sorts before node9 (Slurm's order is node9, node10): the resolver alone
    # would give rank 0, on node9, the address node10:12760.
    "names_sort_differently": (
        Step("node[9-10]", ("node9", "node10"), "2,1", (2, 1)), "",
        {"worker": ["node10:12760", "node9:12760", "node9:12761"]},
    ),
    "cyclic_distribution": (
        dataclasses.replace(TWO_BY_TWO, cyclic=True), "worker=4",
        {"worker": ["node1:12760", "node1:12761", "node2:12760", "node2:12761"]},
    ),
    # Only scontrol expands a suffix after the brackets; the resolver's parser refuses it.
    "suffix_after_range": (
        Step("gpu[01-02]-ib", ("gpu01-ib", "gpu02-ib"), "1(x2)", (1, 1)), "worker=1,evaluator=1",
        {"worker": ["gpu02-ib:12760"], "evaluator": ["gpu01-ib:12760"]},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_task_of_a_two_node_step(case, bin_dir):
    step, slurm_tasks, expected = CASES[case]
    seen = []
    for rank, (node, local_id) in enumerate(step.placement()):
        task = cluster.resolve_task(
            slurm.SLURM, None, environ=step.environ(rank, bin_dir), slurm_tasks=slurm_tasks
        )
        spec, task_type, index = task.spec, task.type, task.index
        assert spec.as_dict() == expected and spec.source == "slurm"
        tf_config = task.tf_config()
        assert tf_config == {"cluster": expected, "task": {"type": task_type, "index": index}}
        # every task is told the address of the node it runs on, at a port of its own there
        assert spec.address(task_type, index) == f"{node}:{JOB_PORT_BASE + local_id}"
        seen.append((task_type, index))
    assert sorted(seen) == sorted(spec.task_list())  # each task of the cluster exactly once


def test_ports_come_from_the_job_id(bin_dir):
    """Two jobs sharing a node never share a port (a fixed 8888 collided on a real cluster)."""
    assert slurm.job_port_base({"SLURM_JOB_ID": "4242"}) == JOB_PORT_BASE
    assert slurm.job_port_base({}) == slurm.PORT_BASE == 8888  # not a Slurm job
    assert slurm.job_port_base({"SLURM_JOB_ID": "1000"}) == slurm.PORT_BASE
    assert slurm.job_port_base({"SLURM_JOB_ID": "999"}) + slurm.PORTS_PER_JOB - 1 < 32768  # below ephemeral ports
    used = {}
    for job_id in ("4242", "4243"):  # two 2-node jobs of 2 tasks a node, on the same nodes
        for rank in range(TWO_BY_TWO.num_tasks):
            task = slurm.resolve("", TWO_BY_TWO.environ(rank, bin_dir, SLURM_JOB_ID=job_id))
            used.setdefault(job_id, set()).add(task.spec.address(task.type, task.index))
    assert len(used["4242"]) == len(used["4243"]) == 4 and not used["4242"] & used["4243"]
    with pytest.raises(UserError, match=r"Invalid Slurm variable SLURM_JOB_ID .*'x'"):
        slurm.resolve("", TWO_BY_TWO.environ(0, bin_dir, SLURM_JOB_ID="x"))
    many = Step("node1", ("node1",), "17", (17,))
    with pytest.raises(UserError, match=r"Too many tasks on one node .*: 17\. .*Expected at most 16 tasks"):
        slurm.resolve("", many.environ(0, bin_dir))
    task = slurm.resolve("", many.environ(16, bin_dir), port_base=20000)  # a port base given: no limit
    assert task.spec.address(task.type, task.index) == "node1:20016"


def test_layout_refuses_task_counts_that_do_not_add_up_to_the_step(bin_dir):
    allocation = slurm.read_allocation(TWO_BY_TWO.environ(0, bin_dir))
    with pytest.raises(UserError, match=r"add up to 3\. Received: \{'worker': 2, 'ps': 1\}\. Expected .* 4 tasks"):
        slurm.layout(allocation, {"worker": 2, "ps": 1}, JOB_PORT_BASE)


def test_types_take_ranks_alphabetically_as_the_resolver_does(bin_dir):
    task = cluster.resolve_task(
        "slurm", "", environ=TWO_BY_TWO.environ(0, bin_dir), slurm_tasks="worker=2,ps=1,chief=1"
    )
    spec, task_type, index = task.spec, task.type, task.index
    assert (task_type, index) == ("chief", 0) and spec.task_types == ("chief", "worker", "ps")


def test_default_is_every_task_a_worker_and_gpus_are_left_alone(bin_dir):
    env = TWO_BY_TWO.environ(3, bin_dir, CUDA_VISIBLE_DEVICES="1")
    before = dict(env)
    task = cluster.resolve_task("slurm", None, environ=env)
    spec, task_type, index = task.spec, task.type, task.index
    assert spec.as_dict() == {"worker": ["node1:12760", "node1:12761", "node2:12760", "node2:12761"]}
    assert (task_type, index) == ("worker", 3)
    assert env == before  # nothing written, CUDA_VISIBLE_DEVICES as Slurm bound it


def test_batch_script_context_reads_the_jobs_variables(bin_dir):
    # In the batch script, before srun: no SLURM_STEP_*, no SLURM_LOCALID.
    env = TWO_BY_TWO.environ(
        0, bin_dir, SLURM_STEP_NODELIST=None, SLURM_STEP_NUM_NODES=None, SLURM_STEP_NUM_TASKS=None,
        SLURM_STEP_TASKS_PER_NODE=None, SLURM_LOCALID=None, SLURM_NTASKS="3", SLURM_TASKS_PER_NODE="2,1",
    )
    task = slurm.resolve("worker=2,ps=1", env)
    spec, task_type, index = task.spec, task.type, task.index
    assert spec.as_dict() == {"worker": ["node1:12761", "node2:12760"], "ps": ["node1:12760"]}
    assert (task_type, index) == ("ps", 0)


@pytest.mark.parametrize(
    "changes, slurm_tasks, match",
    [
        ({"SLURM_PROCID": None}, "", r"Missing Slurm variable SLURM_PROCID .*Expected to run inside a Slurm job step"),
        ({"SLURM_PROCID": "x"}, "", r"Invalid Slurm variable SLURM_PROCID .*Received: SLURM_PROCID='x'"),
        ({"SLURM_PROCID": "4"}, "", r"Received: SLURM_PROCID=4, SLURM_STEP_NUM_TASKS=4\. Expected a rank in 0\.\.3"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2x2"}, "", r"Invalid Slurm variable SLURM_STEP_TASKS_PER_NODE .*'2x2'"),
        ({"SLURM_STEP_TASKS_PER_NODE": "4"}, "", r"Inconsistent Slurm allocation\. .*\(2 nodes\), SLURM_STEP_TASKS_PER_NODE='4'"),
        ({"SLURM_STEP_NUM_TASKS": "3"}, "", r"Inconsistent Slurm allocation\. .*SLURM_STEP_NUM_TASKS=3"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "", r"Inconsistent .*SLURM_STEP_NUM_NODES='3'"),
        ({"SLURM_STEP_NODELIST": "node[1-"}, "", r"scontrol show hostnames failed: .*Invalid hostlist.*Received: SLURM_STEP_NODELIST='node\[1-'"),
        ({"SLURM_STEP_NODELIST": "node1,node1"}, "", r"a node is listed twice"),
        ({"SLURMD_NODENAME": "node7"}, "", r"runs on SLURMD_NODENAME='node7'"),
        ({"SLURM_LOCALID": "2"}, "", r"SLURM_LOCALID=2\. .*Expected a node of the list"),
        ({}, "worker=3", r"`--slurm_tasks`: 3 tasks for a Slurm step of 4\. Received: slurm_tasks='worker=3', SLURM_STEP_NUM_TASKS=4"),
        ({}, "worker=2,ps=x", r"`--slurm_tasks`: the count of 'ps' is 'x'"),
        ({"SLURM_PROCID": "\u00b2"}, "", r"Invalid Slurm variable SLURM_PROCID .*Received: SLURM_PROCID='\u00b2'"),
        ({"SLURM_JOB_ID": "\u00b2"}, "", r"Invalid Slurm variable SLURM_JOB_ID .*Received: SLURM_JOB_ID='\u00b2'"),
        ({}, "worker=\u00b2", r"`--slurm_tasks`: the count of 'worker' is '\u00b2', not an integer >= 1"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x99999999999)"}, "",
         r"Invalid Slurm variable SLURM_STEP_TASKS_PER_NODE .*more tasks or nodes than 65536"),
    ],
    ids=["outside_slurm", "bad_rank", "rank_out_of_range", "bad_tasks_per_node", "tasks_per_node_vs_nodes",
         "tasks_vs_num_tasks", "num_nodes", "scontrol_fails", "node_twice", "unknown_node", "local_id_out_of_range",
         "tasks_do_not_add_up", "bad_slurm_tasks", "rank_superscript", "job_id_superscript",
         "slurm_tasks_superscript", "tasks_per_node_absurd"],
)
def test_bad_allocations_are_one_line_user_errors(changes, slurm_tasks, match, bin_dir):
    env = TWO_BY_TWO.environ(1, bin_dir, **changes)
    with pytest.raises(UserError, match=match) as info:
        cluster.resolve_task("slurm", None, environ=env, slurm_tasks=slurm_tasks)
    assert "\n" not in str(info.value) and "Expected" in str(info.value)


# --------------------------------------------------------------------------- --slurm_tasks and the config


@pytest.mark.parametrize(
    "text, expected",
    [("", {}), ("worker=2", {"worker": 2}), (" chief=1, worker=2 ,ps=1", {"chief": 1, "worker": 2, "ps": 1}),
     ("worker=1,evaluator=1", {"worker": 1, "evaluator": 1})],
)
def test_parse_slurm_tasks(text, expected):
    assert slurm.parse_slurm_tasks(text) == expected


@pytest.mark.parametrize(
    "text, match",
    [("worker", r"'worker' is not type=count"), ("worker=2,master=1", r"unknown task type 'master'"),
     ("worker=1,worker=2", r"'worker' is given twice"), ("worker=0", r"'0', not an integer >= 1"),
     ("worker=-1", r"'-1', not an integer"), ("worker=2,chief=2", r"only one chief"), ("ps=1", r"no worker"),
     ("worker=2,", r"'' is not type=count"), ("worker=\u00b2", r"'\u00b2', not an integer >= 1"),
     ("worker=99999999999", r"more than 65536 tasks")],
)
def test_parse_slurm_tasks_rejects(text, match):
    with pytest.raises(UserError, match=rf"Invalid value for `--slurm_tasks`: .*{match}.*Received: slurm_tasks="):
        slurm.parse_slurm_tasks(text)


def test_config_field_and_its_validation():
    built = config.build_config(overrides={"cluster": "slurm", "slurm_tasks": "chief=1,worker=2,ps=1",
                                           "strategy": "parameter_server"})
    assert built.runtime.slurm_tasks == "chief=1,worker=2,ps=1" and built.runtime.task == ""
    assert config.build_config(overrides={"cluster": "slurm"}).runtime.slurm_tasks == ""
    for overrides, match in [
        ({"cluster": "slurm", "task": "worker:0"}, r"Unexpected `--task` with --cluster=slurm"),
        ({"slurm_tasks": "worker=2"}, r"Unexpected `--slurm_tasks` without --cluster=slurm"),
        ({"cluster": "c.yaml", "task": "worker:0", "slurm_tasks": "worker=2"}, r"without --cluster=slurm"),
        ({"cluster": "slurm", "slurm_tasks": "workers=2"}, r"unknown task type 'workers'"),
        ({"cluster": "c.yaml"}, r"Missing `--task`"),  # a file still needs --task
    ]:
        with pytest.raises(UserError, match=match):
            config.build_config(overrides=overrides)


def test_resolve_task_flag_combinations(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("worker: [127.0.0.1:1]\n")
    with pytest.raises(UserError, match=r"Unexpected `--task` with --cluster=slurm\. Received: task='worker:0'"):
        cluster.resolve_task("slurm", "worker:0", environ={})
    with pytest.raises(UserError, match=r"Unexpected `--slurm_tasks` without --cluster=slurm"):
        cluster.resolve_task(str(path), "worker:0", environ={}, slurm_tasks="worker=1")
    assert cluster.resolve_task(str(path), "worker:0", environ={}, slurm_tasks="").name == "worker:0"


# --------------------------------------------------------------------------- the CLI inside a faked step


def test_tfconfig_prints_every_tasks_tf_config(bin_dir):
    step, slurm_tasks = Step("node[1-2]", ("node1", "node2"), "2,1", (2, 1)), "worker=2,ps=1"
    procs = []
    for rank in range(step.num_tasks):
        env = {**step.environ(rank, bin_dir), "TF_CPP_MIN_LOG_LEVEL": "3"}
        args = ["--cluster", "slurm", "--slurm_tasks", slurm_tasks] + (["--export"] if rank == 0 else [])
        procs.append(start_cli("tfdist.tfconfig", *args, env=env))
    printed = []
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-2000:]
        if rank == 0:
            assert out.startswith("export TF_CONFIG='") and out.endswith("'\n")
            out = out[len("export TF_CONFIG='"):-2]
        printed.append(json.loads(out))
    expected_cluster = {"worker": ["node1:12761", "node2:12760"], "ps": ["node1:12760"]}
    assert [p["cluster"] for p in printed] == [expected_cluster] * 3
    assert [p["task"] for p in printed] == [
        {"type": "ps", "index": 0}, {"type": "worker", "index": 0}, {"type": "worker", "index": 1}
    ]
    for rank, p in enumerate(printed):  # the same as the library's answer for that rank
        assert p == slurm.resolve(slurm_tasks, step.environ(rank, bin_dir)).tf_config()


# --------------------------------------------------------------------------- the sbatch script

# srun: records its arguments, then runs the task command (after the options) once per rank, rank 0 first,
# with SLURM_PROCID set; it exits as srun does, with the highest task status (128 + N for a task killed by
# signal N), or FAKE_SRUN_STATUS. Only the training step runs its tasks (the tfconfig step just succeeds).
FAKE_SRUN = r"""
import json, os, pathlib, subprocess, sys
args = sys.argv[1:]
with open(os.environ["SRUN_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if "tfdist.train" in args:
    model_dir = pathlib.Path(args[args.index("--model_dir") + 1])
    if os.environ.get("FAKE_SUMMARY"):
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "summary.json").write_text("{}")
    command = args[next(i for i, a in enumerate(args) if not a.startswith("-")):]
    statuses = os.environ.get("FAKE_TRAIN_STATUS", "0").split(",")  # per rank; the last one for the rest
    ended = []
    for rank in range(int(os.environ["SLURM_NTASKS"])):
        status = statuses[min(rank, len(statuses) - 1)]
        code = subprocess.run(command, env={**os.environ, "SLURM_PROCID": str(rank), "FAKE_TASK_STATUS": status}).returncode
        ended.append(128 - code if code < 0 else code)
    sys.exit(int(os.environ.get("FAKE_SRUN_STATUS", max(ended))))
"""

# The tasks' python: `python -m tfdist.train` ends with FAKE_TASK_STATUS; one of 128 + N stands for a task
# that srun killed with signal N, with the whole task (the script's bash around it too), as Slurm does.
# Anything else is this interpreter.
FAKE_PYTHON = r"""#!/bin/sh
if [ "$1 $2" = "-m tfdist.train" ]; then
  status="${FAKE_TASK_STATUS:-0}"
  if [ "$status" -ge 128 ]; then kill -$((status - 128)) "$PPID" $$; fi
  exit "$status"
fi
exec "%s" "$@"
"""

# The batch script's scontrol: records `scontrol requeue JOBID` (what Slurm would requeue) and answers
# FAKE_SCONTROL_STATUS (e.g. 1: the job cannot be requeued, as when Slurm already requeues it).
FAKE_SCONTROL_REQUEUE = r"""
import json, os, sys
with open(os.environ["SCONTROL_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
if sys.argv[1:2] != ["requeue"] or len(sys.argv) != 3:
    sys.exit("scontrol: error: this stand-in only knows `requeue JOBID`")
sys.exit(int(os.environ.get("FAKE_SCONTROL_STATUS", "0")))
"""


@dataclasses.dataclass(frozen=True)
class SbatchRun:
    """What one run of train.sbatch did: its status, each srun's and scontrol's arguments, its stderr."""

    status: int
    srun: list[list[str]]
    scontrol: list[list[str]]
    stderr: str


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run_sbatch(tmp_path: Path, *args: str, **env: str) -> SbatchRun:
    """Run train.sbatch as sbatch would on the batch node, with a stand-in srun and scontrol.

    ``python`` on the stand-ins' PATH is this interpreter (the script reads
    the preempted status from ``tfdist.errors`` with it).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, code in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL_REQUEUE)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{code}")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python").write_text(FAKE_PYTHON % sys.executable)  # a symlink would lose the venv
    (bin_dir / "python").chmod(0o755)
    logs = {name: tmp_path / f"{name}.log" for name in ("srun", "scontrol")}
    for log in logs.values():
        log.unlink(missing_ok=True)
    full_env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SRUN_LOG": str(logs["srun"]),
        "SCONTROL_LOG": str(logs["scontrol"]), "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "tfdist", "SLURM_NTASKS": "2",
        **env,
    }
    proc = subprocess.run(["bash", str(SBATCH), *args], cwd=tmp_path, env=full_env, capture_output=True,
                          text=True, timeout=60)
    return SbatchRun(proc.returncode, _calls(logs["srun"]), _calls(logs["scontrol"]), proc.stderr)


def split_call(call: list[str]) -> tuple[list[str], list[str]]:
    """An srun call of the script -> (srun's options, the task's command inside the status-recording bash)."""
    start = next(i for i, a in enumerate(call) if not a.startswith("-"))
    assert call[start:start + 2] == ["bash", "-c"] and call[start + 3] == "tfdist-task", call
    return call[:start], call[start + 4:]


def test_sbatch_script_runs_tfconfig_then_train(tmp_path):
    run = run_sbatch(tmp_path, "--config", "quick", "--epochs", "2")
    assert run.status == 0, run.stderr
    (tfconfig_options, tfconfig), (train_options, train) = map(split_call, run.srun)
    assert tfconfig_options == ["--label", "--kill-on-bad-exit=1"] and train_options == ["--kill-on-bad-exit=1"]
    assert tfconfig == ["python", "-m", "tfdist.tfconfig", "--cluster", "slurm", "--slurm_tasks", "worker=2",
                        "--strategy", "multi_worker_mirrored"]
    model_dir = train[train.index("--model_dir") + 1]
    assert train == ["python", "-m", "tfdist.train", "--cluster", "slurm", "--slurm_tasks", "worker=2",
                     "--strategy", "multi_worker_mirrored", "--model_dir", model_dir, "--config", "quick", "--epochs", "2"]
    assert re.fullmatch(r"runs/tfdist-77-[0-9]{8}T[0-9]{6}Z", model_dir)  # job name, id and first start (UTC)
    assert f"run directory {model_dir}" in run.stderr
    assert run.scontrol == []  # nothing to requeue
    assert not list(tmp_path.glob(".tfdist-job-*"))  # the tasks' status file goes with the job
    text = SBATCH.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks=2" in text


def _model_dir(run: SbatchRun) -> str:
    train = split_call(run.srun[-1])[1]
    return train[train.index("--model_dir") + 1]


def test_sbatch_run_directory_is_never_an_old_run_of_the_same_job_id(tmp_path):
    """Job ids start again at 1 when Slurm's state is wiped: a new job 77 must not resume an old job 77's run."""
    old = tmp_path / "runs" / "tfdist-77-20200101T000000Z"
    old.mkdir(parents=True)
    first = _model_dir(run_sbatch(tmp_path))
    assert first != str(old.relative_to(tmp_path)) and first.startswith("runs/tfdist-77-")
    (tmp_path / first).mkdir()  # what the chief of the first start wrote
    # The same job requeued (`scontrol requeue`, e.g. after status 42): its own directory, the newest of its id.
    assert _model_dir(run_sbatch(tmp_path, SLURM_RESTART_COUNT="1")) == first
    assert _model_dir(run_sbatch(tmp_path, SLURM_RESTART_COUNT="2")) == first
    # Another job name (sbatch --job-name / %x) is another directory; $TFDIST_MODEL_DIR is taken as it is.
    assert _model_dir(run_sbatch(tmp_path, SLURM_JOB_NAME="unet big", SLURM_RESTART_COUNT="1")).startswith(
        "runs/unet_big-77-")
    assert _model_dir(run_sbatch(tmp_path, TFDIST_MODEL_DIR=str(old))) == str(old)


@pytest.mark.parametrize(
    "task_statuses, srun_status, expected",
    [
        ("137,2", None, USAGE_EXIT_CODE),  # --kill-on-bad-exit: rank 1's user error, rank 0 SIGKILLed by srun
        ("143,2", None, USAGE_EXIT_CODE),  # rank 0 ended by srun's SIGTERM before it could save: not its status
        ("2", 143, USAGE_EXIT_CODE),       # srun reports the signal it sent; the tasks ended with 2
        ("0,4", None, PEER_LOST_EXIT_CODE),
        ("137", None, 137),                # no task ended by itself: srun's status
        ("0", None, DONE_EXIT_CODE),
    ],
)
def test_sbatch_job_status_is_tfdists_not_sruns(tmp_path, task_statuses, srun_status, expected):
    env = {"FAKE_TRAIN_STATUS": task_statuses, **({"FAKE_SRUN_STATUS": str(srun_status)} if srun_status else {})}
    run = run_sbatch(tmp_path, **env)
    assert run.status == expected, run.stderr
    assert run.scontrol == [] and not list(tmp_path.glob(".tfdist-job-*"))


def test_sbatch_preempted_first_task_requeues_even_when_others_were_killed(tmp_path):
    run = run_sbatch(tmp_path, FAKE_TRAIN_STATUS=f"{PREEMPTED_EXIT_CODE},137")
    assert run.status == PREEMPTED_EXIT_CODE and run.scontrol == [["requeue", "77"]], run.stderr


def test_sbatch_script_parameter_server_status_is_the_chiefs(tmp_path):
    ps = {"TFDIST_STRATEGY": "parameter_server", "TFDIST_TASKS": "chief=1,worker=2,ps=1", "SLURM_NTASKS": "4",
          "TFDIST_MODEL_DIR": str(tmp_path / "run"), "FAKE_TRAIN_STATUS": "143"}
    run = run_sbatch(tmp_path, **ps)  # the chief never finished: srun's failure stands
    assert run.status == 143
    assert run.srun[1][:2] == ["--kill-on-bad-exit=1", "--wait=60"]
    assert run.srun[1][run.srun[1].index("--slurm_tasks") + 1] == "chief=1,worker=2,ps=1"
    assert run_sbatch(tmp_path, **ps, FAKE_SUMMARY="1").status == 0  # the chief wrote its summary: success
    run = run_sbatch(tmp_path, **{**ps, "TFDIST_STRATEGY": "multi_worker_mirrored"}, FAKE_SUMMARY="1")
    assert run.status == 143  # other strategies: every task ends by itself, so srun's status is the job's
    assert run.scontrol == []  # 143 (killed by SIGTERM, no checkpoint promised) is not a preemption


def sbatch_directives() -> list[str]:
    """The ``#SBATCH`` options of the script, as sbatch reads them (up to the first command)."""
    directives = []
    for line in SBATCH.read_text().splitlines()[1:]:
        if line.startswith("#SBATCH "):
            directives.append(line[len("#SBATCH "):].strip())
        elif line.strip() and not line.startswith("#"):
            break  # sbatch stops reading directives at the first command
    return directives


def test_sbatch_script_asks_for_the_warning_signal_and_requeue():
    """docs/clusters.md: SIGUSR1 90 s before the time limit to every task of the steps (not `B:`, the batch shell only),
    requeue allowed, one log file over the starts; the preempted status is read from tfdist.errors."""
    directives = sbatch_directives()
    (signal,) = [d for d in directives if d.startswith("--signal=")]
    assert signal == "--signal=USR1@90"  # no B: (batch shell only) or R: prefix: the srun tasks get it
    assert "--requeue" in directives and "--open-mode=append" in directives
    commands = [line for line in SBATCH.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in commands if str(PREEMPTED_EXIT_CODE) in line]  # no copy of the status
    assert "from tfdist.errors import PREEMPTED_EXIT_CODE" in "\n".join(commands)


@pytest.mark.parametrize("strategy, tasks", [("multi_worker_mirrored", "worker=2"),
                                             ("parameter_server", "chief=1,worker=2,ps=1")])
def test_sbatch_script_requeues_the_job_when_the_step_was_preempted(tmp_path, strategy, tasks):
    run = run_sbatch(tmp_path, "--config", "quick", TFDIST_STRATEGY=strategy, TFDIST_TASKS=tasks,
                     TFDIST_MODEL_DIR=str(tmp_path / "run"), FAKE_TRAIN_STATUS=str(PREEMPTED_EXIT_CODE))
    assert run.status == PREEMPTED_EXIT_CODE, run.stderr
    assert run.scontrol == [["requeue", "77"]]  # this job, once, after the training step
    assert len(run.srun) == 2 and "requeueing job 77" in run.stderr


@pytest.mark.parametrize("status", [DONE_EXIT_CODE, USAGE_EXIT_CODE, DIVERGED_EXIT_CODE, PEER_LOST_EXIT_CODE, 1, 137])
def test_sbatch_script_does_not_requeue_other_statuses(tmp_path, status):
    run = run_sbatch(tmp_path, FAKE_TRAIN_STATUS=str(status), TFDIST_MODEL_DIR=str(tmp_path / "run"))
    assert run.status == status and run.scontrol == []


def test_sbatch_script_still_ends_with_42_when_the_requeue_is_refused(tmp_path):
    run = run_sbatch(tmp_path, FAKE_TRAIN_STATUS=str(PREEMPTED_EXIT_CODE), FAKE_SCONTROL_STATUS="1",
                     TFDIST_MODEL_DIR=str(tmp_path / "run"))
    assert run.status == PREEMPTED_EXIT_CODE and run.scontrol == [["requeue", "77"]]
    assert f"scontrol requeue 77 failed; submit again with TFDIST_MODEL_DIR={tmp_path / 'run'} to resume" in run.stderr


@pytest.mark.parametrize(
    "args, match",
    [
        ((), r"Missing Slurm variable SLURM_PROCID for --cluster=slurm"),
        (("--task", "worker:0"), r"Unexpected `--task` with --cluster=slurm"),
        (("--slurm_tasks", "worker=two"), r"`--slurm_tasks`: the count of 'worker' is 'two'"),
        (("--commands",), r"--commands with --cluster=slurm"),
        (("--emit", "kubernetes", "--image", "img"), r"Invalid value for `--cluster`\. Received: cluster='slurm'"),
    ],
    ids=["outside_slurm", "task", "bad_slurm_tasks", "commands", "emit"],
)
def test_tfconfig_slurm_errors_are_one_line_before_tensorflow(args, match):
    outside = {k: None for k in os.environ if k.startswith("SLURM")}
    proc = run_cli("tfdist.tfconfig", "--cluster", "slurm", *args, env=outside, timeout=60)
    assert_user_error(proc, match)  # one line: TensorFlow never started
