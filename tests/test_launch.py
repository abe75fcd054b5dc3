"""``python -m tfdist.launch``: environments, addresses, prefixes, exit status, stopping and restarts.

The pure parts (``child_env``, ``localize``, ``stops_cluster``) are checked
in-process; everything else runs the real CLI over small Python tasks (no
TensorFlow, so each test takes seconds), and one test runs a plain
TensorFlow multi-worker script, written without tfdist, unchanged.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import psutil
import pytest

from cluster_runs import REPO, Processes, launcher, loopback_cluster
from tfdist import cluster as cluster_lib
from tfdist import launch
from tfdist.errors import UserError

SPEC = cluster_lib.parse_cluster_spec(
    {"chief": "127.0.0.1:2222", "worker": ["127.0.0.1:2223", "127.0.0.1:2224"], "ps": ["localhost:2225"]},
    source="test",
)

#: A task that prints its TF_CONFIG task, writes its pid (and a grandchild's) and then does what TF_CONFIG's
#: task type asks: ``python TASK.py DIR '{"chief": [status, seconds], ...}'``.
TASK = r"""
import json, os, signal, subprocess, sys, time
directory, plan = sys.argv[1], json.loads(sys.argv[2])
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}:{task['index']}"
status, seconds = plan.get(name, plan.get(task["type"], [0, 0]))
if plan.get("ignore_sigterm"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(os.path.join(directory, f"{name}.{os.getpid()}.pids"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
starts = os.path.join(directory, f"{name}.starts")
with open(starts, "a") as f:
    f.write("x")
if plan.get("fail_first_start") == name and open(starts).read() == "x":
    status = 9
print(f"hello from {name} ({task['type']} {task['index']})", flush=True)
print(f"to stderr from {name}", file=sys.stderr, flush=True)
time.sleep(seconds)
child.kill()
sys.exit(status)
"""


def task_script(tmp_path):
    path = tmp_path / "task.py"
    path.write_text(TASK)
    return path


def run_launcher(tmp_path, cluster, plan, *options, local=True, timeout=60):
    """Run the launcher over TASK with ``plan``; returns (status, stdout+stderr text, seconds)."""
    command = [sys.executable, str(task_script(tmp_path)), str(tmp_path), json.dumps(plan)]
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, *command, local=local, options=options))
        status = proc.wait(timeout)
        return status, proc.text(), time.monotonic() - proc.started


def recorded_pids(tmp_path) -> list[int]:
    return [int(p) for path in tmp_path.glob("*.pids") for p in path.read_text().split()]


def assert_none_left(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert not alive, f"processes left behind: {alive}"


def test_child_env_is_the_base_environment_plus_the_tasks_tf_config():
    base = {"PATH": "/usr/bin", "TF_CONFIG": "stale", "KEEP": "1"}
    env = launch.child_env(base, cluster_lib.Task(spec=SPEC, type="worker", index=1))
    assert json.loads(env["TF_CONFIG"]) == {"cluster": SPEC.as_dict(), "task": {"type": "worker", "index": 1}}
    assert env["KEEP"] == "1" and env["PATH"] == "/usr/bin" and env["PYTHONUNBUFFERED"] == "1"
    assert base["TF_CONFIG"] == "stale"  # the input is not changed
    with pytest.raises(UserError, match="worker:5"):
        launch.child_env(base, cluster_lib.Task(spec=SPEC, type="worker", index=5))


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
    assert launch.exit_status(-9) == 137 and launch.exit_status(3) == 3


def test_every_line_is_prefixed_and_the_status_is_the_chiefs(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2)
    status, text, _ = run_launcher(tmp_path, cluster, {"chief": [5, 0.5], "worker": [0, 0]})
    assert status == 5, text
    for name in ("chief:0", "worker:0", "worker:1"):
        kind, index = name.split(":")
        assert f"[{name}] hello from {name} ({kind} {index})" in text
        assert f"[{name}] to stderr from {name}" in text
    assert "[launch] exit status 5" in text
    assert_none_left(recorded_pids(tmp_path))


def test_without_a_chief_worker_0_decides_the_status(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    status, text, _ = run_launcher(tmp_path, cluster, {"worker:0": [0, 1.0], "worker:1": [0, 0]})
    assert status == 0, text
    assert "[launch] worker:1 exited with status 0" in text and "[launch] worker:0 exited with status 0" in text


def test_a_failure_stops_every_task_with_sigkill_after_the_grace_period(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2)
    plan = {"chief": [0, 300], "worker:0": [0, 300], "worker:1": [7, 1.0], "ignore_sigterm": True}
    status, text, seconds = run_launcher(tmp_path, cluster, plan)
    assert status == 7, text
    assert "[launch] worker:1 failed; stopping every task" in text
    assert seconds < 30, seconds  # 1 s, then 3 s of grace before SIGKILL: far from the tasks' 300 s
    assert len(recorded_pids(tmp_path)) == 6  # three tasks and a grandchild each
    assert_none_left(recorded_pids(tmp_path))


def test_sigterm_to_the_launcher_stops_every_task_and_grandchild(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    command = [sys.executable, str(task_script(tmp_path)), str(tmp_path), json.dumps({"worker": [0, 300]})]
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, *command))
        proc.wait_for(lambda text: text.count("hello from") == 2, 30, "both tasks up")
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
    assert "[launch] received SIGTERM; stopping every task" in proc.text()
    assert_none_left(recorded_pids(tmp_path))


def test_a_lost_parameter_server_worker_or_evaluator_does_not_stop_the_cluster(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2, ps=1, evaluator=1)
    plan = {"chief": [0, 2.0], "worker:1": [137, 0], "evaluator": [1, 0], "worker:0": [0, 1.0], "ps": [0, 1.0]}
    status, text, _ = run_launcher(tmp_path, cluster, plan)
    assert status == 0, text
    assert "[launch] worker:1 failed; the others go on without it" in text
    assert "[launch] evaluator:0 failed; the others go on without it" in text


def test_tasks_still_running_after_the_leader_are_stopped_after_the_shutdown_timeout(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=1, ps=1)
    plan = {"chief": [0, 0.5], "ps": [0, 300], "worker": [0, 300]}
    status, text, seconds = run_launcher(tmp_path, cluster, plan, "--shutdown_timeout=2")
    assert status == 0, text
    assert "still running 2s after chief:0 finished; stopping them" in text and seconds < 30
    assert_none_left(recorded_pids(tmp_path))


def test_max_restarts_starts_every_task_again_after_a_failure(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    plan = {"worker:0": [0, 1.0], "worker:1": [0, 0.2], "fail_first_start": "worker:1"}
    status, text, _ = run_launcher(tmp_path, cluster, plan, "--max_restarts=2")
    assert status == 0, text
    assert "[launch] restarting every task (restart 1 of 2) after worker:1 failed with status 9" in text
    assert text.count("[launch] worker:0 started") == 2 and "restart 2 of 2" not in text
    assert (tmp_path / "worker:0.starts").read_text() == "xx"


def test_user_errors_are_not_restarted(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    plan = {"worker:0": [0, 1.0], "worker:1": [2, 0.2]}
    status, text, _ = run_launcher(tmp_path, cluster, plan, "--max_restarts=2")
    assert status == 2 and "not restarting: status 2 is a user error" in text and "restarting every" not in text


def test_losing_the_last_parameter_server_worker_stops_the_cluster(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2, ps=1)
    plan = {"chief": [0, 300], "ps": [0, 300], "worker:0": [1, 0.2], "worker:1": [1, 0.5], "ignore_sigterm": True}
    status, text, seconds = run_launcher(tmp_path, cluster, plan)
    assert status == 1 and seconds < 30, text
    assert "[launch] worker:0 failed; the others go on without it" in text
    assert "[launch] worker:1 failed; stopping every task" in text
    assert_none_left(recorded_pids(tmp_path))


def test_without_restarts_the_first_failure_is_the_status(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    plan = {"worker:0": [0, 1.0], "worker:1": [0, 0.2], "fail_first_start": "worker:1"}
    status, text, _ = run_launcher(tmp_path, cluster, plan)
    assert status == 9 and "restarting" not in text


@pytest.mark.parametrize(
    "content, needle",
    [
        ("worker: [10.0.0.2:2222, 127.0.0.1:2223]\n", "worker:0 is on another host. Received: 10.0.0.2:2222"),
        (None, "Address already in use: 127.0.0.1:"),
    ],
)
def test_without_local_every_host_must_be_loopback_and_every_port_free(tmp_path, content, needle):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cluster = tmp_path / "c.yaml"
        cluster.write_text(content or f"worker: [127.0.0.1:{port}]\n")
        status, text, _ = run_launcher(tmp_path, cluster, {}, local=False, timeout=30)
    assert status == 2, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and needle in lines[-1] and "Traceback" not in text
    if content is None:
        assert f"127.0.0.1:{port}" in lines[-1]
    assert not recorded_pids(tmp_path)  # nothing was started


def test_a_missing_command_is_a_user_error(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=1)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", [sys.executable, "-m", "tfdist.launch", f"--cluster={cluster}", "--"])
        assert proc.wait(30) == 2
    assert proc.text().strip().splitlines()[-1].startswith("error: Missing COMMAND")


def test_a_plain_tensorflow_multi_worker_script_runs_unchanged(tmp_path):
    """examples/plain_tf_multi_worker.py reads TF_CONFIG itself; both workers end with the same weights."""
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    command = [sys.executable, str(REPO / "examples" / "plain_tf_multi_worker.py"), "--steps=10"]
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, *command))
        assert proc.wait(180) == 0, proc.text()[-3000:]
    text = proc.text()
    finals = {}
    for name in ("worker:0", "worker:1"):
        line = next(l for l in text.splitlines() if l.startswith(f"[{name}] {name} of 2 workers: final weights"))
        finals[name] = json.loads(line.split("final weights ", 1)[1])
    assert finals["worker:0"] == finals["worker:1"]
    assert finals["worker:0"] == pytest.approx([2.0, -3.0, 0.5, 1.0], abs=0.05)
