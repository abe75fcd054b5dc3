"""``tfdist.launch``'s pure parts: a task's environment, local addresses, which failures stop a cluster, the default grace, each pytest worker's ports."""

from __future__ import annotations

import json

import pytest
from absl import flags

from helpers.clis import python_argv, run_cli
from helpers.cluster_runs import (
    ephemeral_low, worker_port_range,
)
from tfdist import cluster as cluster_lib
from tfdist import launch
from tfdist.deploy import processes
from tfdist.cluster.network import PORT_RANGE_ENV, port_range
from tfdist.errors import UserError


SPEC = cluster_lib.parse_cluster_spec(
    {"chief": "127.0.0.1:2222", "worker": ["127.0.0.1:2223", "127.0.0.1:2224"], "ps": ["localhost:2225"]},
    source="test",
)


def test_child_env_is_the_base_environment_plus_the_tasks_tf_config():
    base = {"PATH": "/usr/bin", "TF_CONFIG": "stale", "KEEP": "1"}
    env = processes.child_env(base, cluster_lib.Task(spec=SPEC, type="worker", index=1))
    assert json.loads(env["TF_CONFIG"]) == {"cluster": SPEC.as_dict(), "task": {"type": "worker", "index": 1}}
    assert env["KEEP"] == "1" and env["PATH"] == "/usr/bin" and env["PYTHONUNBUFFERED"] == "1"
    assert base["TF_CONFIG"] == "stale"  # the input is not changed
    with pytest.raises(UserError, match="worker:5"):
        processes.child_env(base, cluster_lib.Task(spec=SPEC, type="worker", index=5))


def test_localize_gives_every_task_its_own_free_port_on_127_0_0_1():
    local = launch.localize(SPEC)
    assert local.task_list() == SPEC.task_list()
    hosts_ports = [cluster_lib.split_address(a) for a in local.addresses()]
    assert {h for h, _ in hosts_ports} == {"127.0.0.1"}
    assert len({p for _, p in hosts_ports}) == SPEC.num_tasks
    launch.check_local(local)  # loopback and free: accepted


def test_which_failures_stop_the_cluster():
    mwm = cluster_lib.parse_cluster_spec({"worker": ["127.0.0.1:1", "127.0.0.1:2"], "evaluator": "127.0.0.1:3"},
                                     source="test")
    assert launch.stops_cluster(mwm, "worker") and not launch.stops_cluster(mwm, "evaluator")
    assert not launch.stops_cluster(SPEC, "worker")  # the coordinator reschedules a lost worker's steps
    assert launch.stops_cluster(SPEC, "ps") and launch.stops_cluster(SPEC, "chief")
    assert processes.exit_status(-9) == 137 and processes.exit_status(3) == 3


def test_the_default_grace_leaves_a_task_time_to_save_its_checkpoint():
    flag_values = flags.FlagValues()
    launch.define_flags(flag_values)
    assert flag_values["grace_seconds"].default == launch.GRACE_SECONDS == 60
    assert "checkpoint" in flag_values["grace_seconds"].help


def test_each_pytest_worker_has_its_own_ports_below_the_ephemeral_range(monkeypatch):
    assert worker_port_range("gw0", 2, 32768) == "20000-24999"
    assert worker_port_range("gw1", 2, 32768) == "25000-29999"
    assert worker_port_range("master", 1, 32768) == "20000-24999"
    assert worker_port_range("gw3", 4, 32768) == "29576-32767"  # narrower slices, all below 32768
    assert worker_port_range("gw0", 2, 20100) == ""  # no room: let the system pick
    if ephemeral_low() >= 30000:  # room below it (Linux's default starts at 32768): this worker has its own range
        lo, hi = port_range()  # set by conftest, and inherited by every process the worker starts
        assert 20000 <= lo <= hi < ephemeral_low()
    monkeypatch.setenv(PORT_RANGE_ENV, "21000-21009")
    ports = [cluster_lib.split_address(a)[1] for a in launch.localize(SPEC).addresses()]
    ports += [cluster_lib.split_address(a)[1] for a in launch.localize(SPEC).addresses()]
    assert len(set(ports)) == 8 and all(21000 <= p <= 21009 for p in ports), ports  # no port twice in a row
    monkeypatch.setenv(PORT_RANGE_ENV, "9-8")
    with pytest.raises(UserError, match="Invalid TFDIST_PORT_RANGE. Received: '9-8'"):
        launch.localize(SPEC)



#: A task that prints TensorFlow's CPU-only cuInit line (as TensorFlow 2.21 does on stderr), then its own lines.
NOISY_TASK = r"""
import sys
sys.stderr.write("E0000 00:00:1796170225.367140   27408 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA "
                 "error: Failed call to cuInit: UNKNOWN ERROR (303)\n")
sys.stderr.write("a warning of the task's own\n")
print("trained")
"""


@pytest.mark.parametrize("flags_, env, noise_shown", [([], {}, False), (["--show_startup_noise"], {}, True),
                                                      ([], {"TFDIST_TF_LOGS": "1"}, True)],
                         ids=["default", "show_startup_noise", "opt_out"])
def test_the_launcher_drops_tensorflows_start_up_lines_from_its_tasks_unless_asked(tmp_path, flags_, env, noise_shown):
    """A script under tfdist.launch on a CPU-only machine does not print ``failed call to cuInit`` once per task."""
    spec = tmp_path / "cluster.yaml"
    spec.write_text("worker: [127.0.0.1:2222, 127.0.0.1:2223]\n")
    proc = run_cli("tfdist.launch", f"--cluster={spec}", "--local", *flags_, "--", *python_argv(NOISY_TASK),
                   env={"TF_CPP_MIN_LOG_LEVEL": None, **env}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("] trained\n") == 2
    assert proc.stderr.count("] a warning of the task's own\n") == 2
    assert proc.stderr.count("failed call to cuInit") == (2 if noise_shown else 0), proc.stderr
