"""``parameter_server`` with 2 ps tasks: whole variables spread over both; ``--ps_shards > 1`` refused up front.

Keras 3 variables cannot wrap TensorFlow's ``ShardedVariable`` (a variable
partitioner fails in ``tape.gradient``), so tfdist does not
partition variables; ``ParameterServerStrategy`` still places whole
variables on the ps tasks round-robin, which is how several ps tasks share
the variables. The cluster runs in a fresh process (in-process gRPC servers
on 127.0.0.1, as in ``test_parameter_server``): connecting to a cluster
changes the process's TensorFlow context, which the other tests must not
inherit.
"""

import json


SCRIPT = r"""
import json, os, sys
os.environ["GRPC_FAIL_FAST"] = "use_caller"
from tfdist.strategies import setup_host
setup_host(inter_op_threads=5)  # num_workers + num_ps + 1: a cluster on 2 cores hangs with fewer
from tfdist.segmentation import config as experiment_config
from tfdist.deploy.in_process import in_process_cluster
from tfdist.segmentation import run
resolver = in_process_cluster(num_workers=2, num_ps=2)
config = experiment_config.build_config(overrides={
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


