"""The coordinator loop over an in-process cluster of real gRPC servers on 127.0.0.1.

Runs in a fresh process: connecting to a cluster changes the process's
TensorFlow context, which the other tests must not inherit.
"""

import json

SCRIPT = r"""
import json, os, sys
os.environ["GRPC_FAIL_FAST"] = "use_caller"
from tfdist.strategies import setup_host
setup_host(inter_op_threads=4)
from tfdist import config as config_lib
from tfdist.cluster.local import in_process_cluster
from tfdist.training import run
resolver = in_process_cluster(num_workers=2, num_ps=1)
config = config_lib.build_config(overrides={
    "strategy": "parameter_server", "image_size": 32, "train_examples": 64, "eval_examples": 16,
    "base_filters": 4, "depth": 2, "global_batch_size": 8, "epochs": 2, "steps_per_epoch": 6,
    "learning_rate": 0.01, "log_every": 3, "checkpoint_every": 6, "model_dir": sys.argv[1]})
summary = run(config, verbose=False, cluster_resolver=resolver)
print("SUMMARY " + json.dumps(summary))
"""


def test_parameter_server_trains_with_variables_on_ps(python, tmp_path):
    result = python([ "-c", SCRIPT, str(tmp_path / "ps")], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("SUMMARY "))
    summary = json.loads(line[len("SUMMARY "):])
    assert summary["strategy"] == "parameter_server"
    assert summary["steps"] >= 12  # at-least-once: never fewer than scheduled
    assert all("/job:ps" in d for d in summary["variable_devices"]), summary["variable_devices"]
    rows = [json.loads(l) for l in (tmp_path / "ps" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in rows if r["split"] == "train"]
    assert len(train) == 4 and train[-1] < train[0]
    assert (tmp_path / "ps" / "checkpoints" / "checkpoint").exists()
    assert (tmp_path / "ps" / "export" / "model.keras").exists()
