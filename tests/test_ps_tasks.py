"""``parameter_server`` with 2 ps tasks: whole variables spread over both; ``--ps_shards > 1`` refused up front.

Keras 3 variables cannot wrap TensorFlow's ``ShardedVariable`` (a variable
partitioner fails in ``tape.gradient``: DESIGN.md), so tfdist does not
partition variables; ``ParameterServerStrategy`` still places whole
variables on the ps tasks round-robin, which is how several ps tasks share
the variables. The cluster runs in a fresh process (in-process gRPC servers
on 127.0.0.1, as in ``test_parameter_server``): connecting to a cluster
changes the process's TensorFlow context, which the other tests must not
inherit.
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml

from test_tfconfig import assert_user_error

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, os, sys
os.environ["GRPC_FAIL_FAST"] = "use_caller"
from tfdist.strategies import setup_host
setup_host(inter_op_threads=5)  # num_workers + num_ps + 1: a cluster on 2 cores hangs with fewer (DESIGN.md)
from tfdist import config as config_lib
from tfdist.deploy.in_process import in_process_cluster
from tfdist.segmentation import run
resolver = in_process_cluster(num_workers=2, num_ps=2)
config = config_lib.build_config(overrides={
    "strategy": "parameter_server", "ps_shards": 1, "image_size": 16, "train_examples": 16, "eval_examples": 4,
    "base_filters": 4, "depth": 1, "global_batch_size": 4, "epochs": 1, "steps_per_epoch": 6, "log_every": 3,
    "checkpoint_every": 6, "export": False, "model_dir": sys.argv[1]})
summary = run(config, verbose=False, cluster_resolver=resolver)
print("SUMMARY " + json.dumps(summary))
"""


def test_two_ps_tasks_both_hold_variables_and_training_runs_the_exact_steps(python, tmp_path):
    result = python(["-c", SCRIPT, str(tmp_path / "run")], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("SUMMARY "))
    summary = json.loads(line[len("SUMMARY "):])
    hosts = {device.split("/device:")[0] for device in summary["variable_devices"]}
    assert hosts == {"/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"}, summary["variable_devices"]
    assert summary["steps"] == 6  # no worker lost: each of the 6 scheduled closures ran once
    assert sum(summary["closures_per_worker"].values()) == 6, summary["closures_per_worker"]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [3, 6]


def test_ps_shards_above_one_is_one_line_before_tensorflow_starts(tmp_path):
    """docs/running.md: `--ps_shards 2` ends with status 2 and one line, before TensorFlow starts.

    --model_dir stays untouched."""
    spec = tmp_path / "cluster.yaml"  # 2 ps tasks, nothing listening: the refusal comes before any connection
    spec.write_text(yaml.safe_dump({"chief": "127.0.0.1:1", "worker": ["127.0.0.1:2"],
                                    "ps": ["127.0.0.1:3", "127.0.0.1:4"]}))
    model_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist.train", "--strategy", "parameter_server", "--ps_shards", "2",
         "--cluster", str(spec), "--task", "chief:0", "--connect_timeout", "5", "--model_dir", str(model_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    line = assert_user_error(proc.returncode, proc.stdout, proc.stderr,
                             r"^error: Invalid value for `--ps_shards`: variable partitioning does not work with "
                             r"Keras 3 .*Received: ps_shards=2\. Expected 0 or 1")
    assert "ShardedVariable" in line
    assert not model_dir.exists()
