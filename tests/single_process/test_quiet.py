"""TensorFlow's start-up lines are kept off stderr in every tfdist CLI (``tfdist.quiet``), with an opt-out.

The CLIs run as a user runs them: real processes. TensorFlow 2.21 prints its
start-up lines whatever ``TF_CPP_MIN_LOG_LEVEL`` says; here a user
error found after TensorFlow started is one line on stderr, a quick run has
none of those lines, and ``TFDIST_TF_LOGS=1`` shows them again. The
forwarder keeps a line that reaches it in two reads whole: a start-up line
split so is dropped whole, any other line is forwarded whole.
"""

import re

import yaml

from helpers.clis import assert_user_error, run_cli
from tfdist import quiet
from tfdist.cluster.network import free_ports
from tfdist.errors import USAGE_EXIT_CODE
from unit.test_quiet import noise


def _lost_peer_cluster(tmp_path):
    """worker:1 of a 2-worker cluster on 127.0.0.1 never starts: worker:0 finds out after TensorFlow started."""
    ports = free_ports(2)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"worker": [f"127.0.0.1:{p}" for p in ports]}))
    return ["--cluster", str(path), "--task", "worker:0", "--strategy", "multi_worker_mirrored",
            "--connect_timeout", "1", "--model_dir", str(tmp_path / "run")], ports[1]


def test_a_user_error_after_tensorflow_started_is_one_line(tmp_path):
    args, port = _lost_peer_cluster(tmp_path)
    result = run_cli("tfdist.train", "--config", "quick", *args)
    assert_user_error(result, "^" + re.escape(f"error: No answer within --connect_timeout=1s from worker:1 at "
                                              f"127.0.0.1:{port}"))


def test_the_opt_out_shows_the_start_up_lines(tmp_path):
    args, _ = _lost_peer_cluster(tmp_path)
    result = run_cli("tfdist.train", "--config", "quick", *args, env={quiet.OPT_OUT_ENV: "1"})
    assert result.returncode == USAGE_EXIT_CODE, result.stderr[-2000:]
    assert noise(result.stderr), result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: No answer within") and len([x for x in lines if x.startswith("error")]) == 1


def test_a_quick_run_has_no_start_up_lines(tmp_path):
    result = run_cli("tfdist.train", "--config", "quick", "--strategy", "one_device", "--steps_per_epoch", "2",
                     "--noexport", "--model_dir", str(tmp_path / "run"), timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    for needle in ("absl::InitializeLog", "cuInit", "cudart", "oneDNN", "Unable to register"):
        assert needle not in result.stderr, result.stderr
    assert "final eval" in result.stdout


