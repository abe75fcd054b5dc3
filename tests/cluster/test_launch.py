"""``python -m tfdist.launch``: environments, addresses, prefixes, exit status, stopping, signals and restarts.

The pure parts (``child_env``, ``localize``, ``stops_cluster``) are checked
in-process; everything else runs the real CLI over small Python tasks (no
TensorFlow, so each test takes seconds), ordered by handshakes, never by
sleeps: a task waits until others are up (a file each writes) or gone (reaped
by the launcher). Preemption uses tasks that record each SIGTERM in a file
and exit 42 as tfdist.train does (or ignore it): a preempted launcher
forwards it and exits 42, a task preempted alone is restarted like a failure,
a launcher signalled while it stops the cluster after a failure says once
that it does not restart, and the tasks die with a launcher killed with
SIGKILL. Then real ``tfdist.train`` tasks: a diverged run is not restarted,
Ctrl-C leaves no process behind, a port taken before a task binds it is
retried on new ports; and a plain TensorFlow multi-worker script, written
without tfdist, runs unchanged.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers.clis import assert_user_error, cli_argv, run_cli
from helpers.cluster_runs import (
    MWM, REPO, SHORT, Processes, alive, assert_none_left, descendants, every_started_pid, launcher,
    loopback_cluster, started_pids, train_command,
)
from tfdist import cluster as cluster_lib
from tfdist import launch
from tfdist.deploy import processes
from tfdist.errors import PREEMPTED_EXIT_CODE


#: A stand-in task: ``python TASK.py DIR PLAN``. It prints its TF_CONFIG task (to stdout and stderr), records
#: its pid and a grandchild's, writes ``DIR/NAME.up<start>``, waits for the conditions of its plan, then exits
#: with the plan's status (or runs ``forever``). PLAN maps a task (``worker:1``) or a type (``worker``) to
#: ``{"exit": N, "after": ["chief:0 up", "worker:1 gone"], "forever": bool}``: "up" means that task has written
#: its up file, "gone" that it has exited and the launcher has reaped it. Conditions refer to the same start
#: of the cluster (a task's start counts its starts). ``ignore_sigterm`` and ``fail_first_start`` apply to all.
TASK = r"""
import json, os, signal, subprocess, sys, time
directory, plan = sys.argv[1], json.loads(sys.argv[2])
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}:{task['index']}"
mine = {"exit": 0, **plan.get(task["type"], {}), **plan.get(name, {})}
if plan.get("ignore_sigterm"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(os.path.join(directory, f"{name}.{os.getpid()}.pids"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
with open(os.path.join(directory, f"{name}.starts"), "a") as f:
    f.write("x")
start = len(open(os.path.join(directory, f"{name}.starts")).read())
status = 9 if plan.get("fail_first_start") == name and start == 1 else mine["exit"]
print(f"hello from {name} ({task['type']} {task['index']})", flush=True)
print(f"to stderr from {name}", file=sys.stderr, flush=True)
open(os.path.join(directory, f"{name}.up{start}"), "w").close()

def met(condition):
    other, state = condition.split()
    if state == "up":
        return os.path.exists(os.path.join(directory, f"{other}.up{start}"))
    try:
        os.kill(int(open(os.path.join(directory, f"{other}.exiting{start}")).read()), 0)
        return False  # still running, or exited but not reaped by the launcher yet
    except (FileNotFoundError, ValueError):
        return False
    except ProcessLookupError:
        return True

deadline = time.monotonic() + 60
for condition in mine.get("after", []):
    while not met(condition):
        if time.monotonic() > deadline:
            print(f"{name}: still waiting for {condition} after 60 s", flush=True)
            sys.exit(99)
        time.sleep(0.02)
if mine.get("forever"):
    time.sleep(300)
with open(os.path.join(directory, f"{name}.exiting{start}"), "w") as f:
    f.write(str(os.getpid()))
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


def test_every_line_is_prefixed_and_the_status_is_the_chiefs(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2)
    status, text, _ = run_launcher(tmp_path, cluster, {"chief": {"exit": 5, "after": ["worker:0 up", "worker:1 up"]}})
    assert status == 5, text
    for name in ("chief:0", "worker:0", "worker:1"):
        kind, index = name.split(":")
        assert f"[{name}] hello from {name} ({kind} {index})" in text
        assert f"[{name}] to stderr from {name}" in text
    assert "[launch] exit status 5" in text
    assert_none_left(recorded_pids(tmp_path))


def test_without_a_chief_worker_0_decides_the_status(tmp_path):
    """Worker 0 leads: once it is done, worker 1 (still serving) is stopped after the shutdown timeout."""
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    plan = {"worker:0": {"exit": 0, "after": ["worker:1 up"]}, "worker:1": {"forever": True}}
    status, text, _ = run_launcher(tmp_path, cluster, plan, "--shutdown_timeout=1")
    assert status == 0, text
    assert "[launch] worker:0 exited with status 0" in text
    assert "[launch] worker:1 still running 1s after worker:0 finished; stopping them" in text
    assert_none_left(recorded_pids(tmp_path))


def test_a_failure_stops_every_task_with_sigkill_after_the_grace_period(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2)
    plan = {"chief": {"forever": True}, "worker:0": {"forever": True},
            "worker:1": {"exit": 7, "after": ["chief:0 up", "worker:0 up"]}, "ignore_sigterm": True}
    status, text, seconds = run_launcher(tmp_path, cluster, plan)
    assert status == 7, text
    assert "[launch] worker:1 failed; stopping every task" in text
    assert "[launch] chief:0, worker:0 still running 3s after SIGTERM: SIGKILL" in text
    assert seconds < 30, seconds  # 3 s of grace before SIGKILL: far from the tasks' 300 s
    assert len(recorded_pids(tmp_path)) == 6  # three tasks and a grandchild each
    assert_none_left(recorded_pids(tmp_path))


def test_sigterm_to_the_launcher_stops_every_task_and_grandchild(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    command = [sys.executable, str(task_script(tmp_path)), str(tmp_path), json.dumps({"worker": {"forever": True}})]
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, *command))
        proc.wait_for(lambda text: text.count("hello from") == 2, 30, "both tasks up")
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.wait(30) == PREEMPTED_EXIT_CODE
    assert "[launch] received SIGTERM: a preemption; stopping every task" in proc.text()
    assert_none_left(recorded_pids(tmp_path))


def test_a_lost_parameter_server_worker_or_evaluator_does_not_stop_the_cluster(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2, ps=1, evaluator=1)
    plan = {"chief": {"exit": 0, "after": ["worker:1 gone", "evaluator:0 gone"]}, "worker:1": {"exit": 137},
            "evaluator": {"exit": 1}}
    status, text, _ = run_launcher(tmp_path, cluster, plan)
    assert status == 0, text
    assert "[launch] worker:1 failed; the others go on without it" in text
    assert "[launch] evaluator:0 failed; the others go on without it" in text


def test_tasks_still_running_after_the_leader_are_stopped_after_the_shutdown_timeout(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=1, ps=1)
    plan = {"chief": {"exit": 0, "after": ["ps:0 up", "worker:0 up"]}, "ps": {"forever": True},
            "worker": {"forever": True}}
    status, text, seconds = run_launcher(tmp_path, cluster, plan, "--shutdown_timeout=2")
    assert status == 0, text
    assert "still running 2s after chief:0 finished; stopping them" in text and seconds < 30
    assert_none_left(recorded_pids(tmp_path))


def test_max_restarts_starts_every_task_again_after_a_failure(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    plan = {"worker:0": {"exit": 0, "after": ["worker:1 gone"]}, "worker:1": {"exit": 0, "after": ["worker:0 up"]},
            "fail_first_start": "worker:1"}
    status, text, _ = run_launcher(tmp_path, cluster, plan, "--max_restarts=2")
    assert status == 0, text
    assert "[launch] restarting every task (restart 1 of 2) after worker:1 failed with status 9" in text
    assert text.count("[launch] worker:0 started") == 2 and "restart 2 of 2" not in text
    assert (tmp_path / "worker:0.starts").read_text() == "xx"


def test_user_errors_are_not_restarted(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    plan = {"worker:0": {"exit": 0, "after": ["worker:1 gone"]}, "worker:1": {"exit": 2, "after": ["worker:0 up"]}}
    status, text, _ = run_launcher(tmp_path, cluster, plan, "--max_restarts=2")
    assert status == 2 and "not restarting: status 2 is a user error" in text and "restarting every" not in text


def test_losing_the_last_parameter_server_worker_stops_the_cluster(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2, ps=1)
    plan = {"chief": {"forever": True}, "ps": {"forever": True},
            "worker:0": {"exit": 1, "after": ["chief:0 up", "ps:0 up", "worker:1 up"]},
            "worker:1": {"exit": 1, "after": ["worker:0 gone"]}, "ignore_sigterm": True}
    status, text, seconds = run_launcher(tmp_path, cluster, plan)
    assert status == 1 and seconds < 30, text
    assert "[launch] worker:0 failed; the others go on without it" in text
    assert "[launch] worker:1 failed; stopping every task" in text
    assert_none_left(recorded_pids(tmp_path))


def test_without_restarts_the_first_failure_is_the_status(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    plan = {"worker:0": {"exit": 0, "after": ["worker:1 gone"]}, "worker:1": {"exit": 0, "after": ["worker:0 up"]},
            "fail_first_start": "worker:1"}
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
        proc = procs.start("launch", cli_argv("tfdist.launch", f"--cluster={cluster}", "--"))
        assert proc.wait(30) == 2
    assert proc.text().strip().splitlines()[-1].startswith("error: Missing COMMAND")


@pytest.mark.parametrize("flag", ["--grace_seconds=nan", "--grace_seconds=inf", "--shutdown_timeout=nan",
                                  "--shutdown_timeout=inf"])
def test_a_timeout_that_is_not_a_finite_number_is_one_line_and_nothing_starts(tmp_path, flag):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=1)
    marker = tmp_path / "started"
    result = run_cli("tfdist.launch", f"--cluster={cluster}", "--local", flag, "--", "touch", str(marker), timeout=60)
    name = flag.split("=")[0]
    assert_user_error(result, "^" + re.escape(f"error: invalid command line: flag {flag}: {name} must be a finite "
                                              "number of seconds") + "$")
    assert not marker.exists()


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


# --------------------------------------------------------------------------- preemption and signals

#: A stand-in for a tfdist task that can be preempted: ``python PREEMPTIBLE.py DIR PLAN``. On SIGTERM it appends
#: ``SIGTERM <start>`` to ``DIR/NAME.signals`` and exits 42 (as tfdist.train does once it has saved its
#: checkpoint), unless PLAN's "ignore" lists it (it goes on, to be SIGKILLed). Once its handler is in place it
#: records its pid (``DIR/NAME.pids``), writes ``DIR/NAME.up<start>`` and prints ``NAME up (start N)``; then a
#: task of PLAN's "self" waits for every task's up file and exits 42 by itself, the others sleep (60 s at most).
#: From start PLAN["done_from"] on, every task exits 0 at once instead (a resumed run that finishes).
PREEMPTIBLE = r"""
import json, os, signal, sys, time
directory, plan = sys.argv[1], json.loads(sys.argv[2])
config = json.loads(os.environ["TF_CONFIG"])
name = f"{config['task']['type']}:{config['task']['index']}"
with open(os.path.join(directory, f"{name}.starts"), "a") as f:
    f.write("x")
start = len(open(os.path.join(directory, f"{name}.starts")).read())

def preempted(signum, frame):
    with open(os.path.join(directory, f"{name}.signals"), "a") as f:
        f.write(f"{signal.Signals(signum).name} {start}\n")
    if name not in plan.get("ignore", []):
        sys.exit(42)

signal.signal(signal.SIGTERM, preempted)
with open(os.path.join(directory, f"{name}.pids"), "a") as f:
    f.write(f"{os.getpid()}\n")
if start >= plan.get("done_from", 10**9):
    sys.exit(0)
open(os.path.join(directory, f"{name}.up{start}"), "w").close()
print(f"{name} up (start {start})", flush=True)
everyone = [f"{t}:{i}" for t, addresses in config["cluster"].items() for i in range(len(addresses))]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if name in plan.get("self", []) and all(
            os.path.exists(os.path.join(directory, f"{other}.up{start}")) for other in everyone):
        sys.exit(42)
    time.sleep(0.05)
sys.exit(99)
"""


def start_preemptible(procs, tmp_path, cluster, plan, *options):
    """Start the launcher over PREEMPTIBLE with ``plan`` (``options`` come after cluster_runs' --grace_seconds=3)."""
    script = tmp_path / "preemptible.py"
    script.write_text(PREEMPTIBLE)
    return procs.start("launch", launcher(cluster, sys.executable, str(script), str(tmp_path), json.dumps(plan),
                                          options=options))


def all_up(proc, count: int, start: int = 1) -> dict[str, int]:
    """Wait until ``count`` tasks have printed that they are up; ``task -> pid``."""
    return proc.wait_for(lambda text: text.count(f" up (start {start})") == count and started_pids(text), 30,
                         f"{count} tasks up")


def signals_seen(tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.signals"
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_preemption_of_the_launcher_is_forwarded_to_every_task_and_ends_it_with_status_42(tmp_path, signum):
    """SIGTERM or SIGUSR1 to the launcher: SIGTERM to every task, SIGKILL for the one that ignores it, status 42."""
    cluster = loopback_cluster(tmp_path / "c.yaml", chief=1, worker=2)
    with Processes(tmp_path) as procs:
        proc = start_preemptible(procs, tmp_path, cluster, {"ignore": ["worker:1"]}, "--grace_seconds=1",
                                 "--max_restarts=3")
        pids = all_up(proc, 3)
        proc.popen.send_signal(signum)
        assert proc.wait(20) == PREEMPTED_EXIT_CODE, proc.text()
    text = proc.text()
    assert f"[launch] received {signum.name}: a preemption; stopping every task (SIGTERM, SIGKILL after 1s)" in text
    for name in ("chief:0", "worker:0", "worker:1"):
        assert signals_seen(tmp_path, name) == "SIGTERM 1\n", name  # SIGTERM, whichever signal the launcher got
    for name in ("chief:0", "worker:0"):
        assert f"[launch] {name} exited with status 42 (stopped)" in text  # it would have saved its checkpoint
    assert "[launch] worker:1 still running 1s after SIGTERM: SIGKILL" in text
    assert "[launch] worker:1 exited with status 137 (stopped)" in text
    assert "restarting" not in text and "[launch] exit status 42" in text  # asked to stop: no restart
    assert_none_left(pids.values())


def test_a_task_that_exits_42_by_itself_restarts_every_task_until_no_restart_is_left(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = start_preemptible(procs, tmp_path, cluster, {"self": ["worker:1"]}, "--max_restarts=1")
        assert proc.wait(30) == PREEMPTED_EXIT_CODE, proc.text()
    text = proc.text()
    assert text.count("[launch] worker:1 was preempted; stopping every task") == 2
    assert "[launch] restarting every task (restart 1 of 1) after worker:1 was preempted with status 42" in text
    assert (tmp_path / "worker:0.starts").read_text() == "xx" and (tmp_path / "worker:1.starts").read_text() == "xx"
    assert signals_seen(tmp_path, "worker:0") == "SIGTERM 1\nSIGTERM 2\n"  # stopped by the launcher each time
    assert "[launch] exit status 42" in text
    assert_none_left(recorded_pids(tmp_path))


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_sigterm_to_one_task_preempts_it_and_a_restart_resumes_the_run(tmp_path, max_restarts):
    """One task preempted on its own (a SIGTERM to its pid, not to the launcher) counts like a failure."""
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = start_preemptible(procs, tmp_path, cluster, {"done_from": 2}, f"--max_restarts={max_restarts}")
        os.kill(all_up(proc, 2)["worker:1"], signal.SIGTERM)
        status = proc.wait(30)
    text = proc.text()
    assert "[launch] worker:1 exited with status 42" in text and "worker:1 was preempted; stopping every task" in text
    assert signals_seen(tmp_path, "worker:0") == "SIGTERM 1\n"
    if max_restarts:
        assert status == 0, text
        assert "[launch] restarting every task (restart 1 of 1) after worker:1 was preempted with status 42" in text
        assert (tmp_path / "worker:0.starts").read_text() == "xx"
    else:
        assert status == PREEMPTED_EXIT_CODE and "restarting" not in text, text
        assert (tmp_path / "worker:0.starts").read_text() == "x"
    assert_none_left(recorded_pids(tmp_path))


#: ``python STOPPED_SLOWLY.py DIR``: worker:1 fails (status 7) once worker:0 is up; worker:0 takes the launcher's
#: SIGTERM as a preemption that takes a while: it writes ``DIR/stopping`` and exits 42 only once the test has
#: signalled the launcher (``DIR/launcher-signalled``), so that the signal comes while the cluster stops.
STOPPED_SLOWLY = r"""
import json, os, signal, sys, time
directory = sys.argv[1]
task = json.loads(os.environ["TF_CONFIG"])["task"]
up, stopping, signalled = (os.path.join(directory, f) for f in ("worker-0.up", "stopping", "launcher-signalled"))
signal.signal(signal.SIGTERM, lambda *_: open(stopping, "w").close())
deadline = time.monotonic() + 60
if task["index"] == 1:
    while not os.path.exists(up) and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(7)
open(up, "w").close()
while not os.path.exists(signalled) and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(42)
"""


def test_a_sigterm_while_the_cluster_stops_after_a_failure_is_said_once_and_nothing_restarts(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    script = tmp_path / "stopped_slowly.py"
    script.write_text(STOPPED_SLOWLY)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script), str(tmp_path),
                                              options=("--grace_seconds=60", "--max_restarts=2")))
        proc.wait_for(lambda _: (tmp_path / "stopping").exists(), 30, "the launcher stopping worker:0")
        proc.popen.send_signal(signal.SIGTERM)
        (tmp_path / "launcher-signalled").touch()
        status = proc.wait(30)
    text = proc.text()
    assert status == PREEMPTED_EXIT_CODE, text
    assert "[launch] worker:1 failed; stopping every task" in text
    assert [line for line in text.splitlines() if "restart" in line] == ["[launch] not restarting: received SIGTERM"], \
        text
    assert text.count("[launch] worker:0 started") == 1 and "[launch] exit status 42" in text, text


def test_a_second_ctrl_c_kills_the_tasks_without_waiting_out_the_grace(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = start_preemptible(procs, tmp_path, cluster, {"ignore": ["worker:0", "worker:1"]}, "--grace_seconds=60")
        pids = all_up(proc, 2)
        proc.popen.send_signal(signal.SIGINT)
        proc.wait_for(lambda _: all(signals_seen(tmp_path, n) for n in pids), 10, "SIGTERM to every task")
        again = time.monotonic()
        proc.popen.send_signal(signal.SIGINT)
        assert proc.wait(15) == 128 + signal.SIGINT, proc.text()
        assert time.monotonic() - again < 10  # not the 60 s of grace
    text = proc.text()
    assert "[launch] received SIGINT; stopping every task (Ctrl-C again: SIGKILL now)" in text
    assert "[launch] worker:0, worker:1 still running at the second Ctrl-C: SIGKILL" in text
    assert "[launch] worker:0 exited with status 137 (stopped)" in text
    assert_none_left(pids.values())


def test_the_tasks_die_with_the_launcher_even_when_it_is_killed_with_sigkill(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    pids: dict[str, int] = {}
    try:
        with Processes(tmp_path) as procs:
            proc = start_preemptible(procs, tmp_path, cluster, {})
            pids = all_up(proc, 2)
            os.kill(proc.pid, signal.SIGKILL)  # the launcher alone (its tasks have process groups of their own)
            assert proc.wait(10) == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while alive(pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert_none_left(pids.values())
        assert not any(signals_seen(tmp_path, name) for name in pids)  # SIGKILLed by the kernel, not stopped
    finally:
        for pid in alive(pids.values()):
            os.kill(pid, signal.SIGKILL)


def test_a_task_whose_launcher_died_before_it_started_kills_itself():
    """The race that PR_SET_PDEATHSIG alone misses: ``die_with`` a pid that is not the parent (any more)."""
    preexec = processes.die_with(os.getppid())  # this process's parent stands in for a launcher already gone
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=preexec)
    try:
        assert child.wait(10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait(10)


# --------------------------------------------------------------------------- ports


#: ``python TAKE.py MARKER -- COMMAND...``. The first start runs COMMAND, but as worker:1 it first takes that
#: task's port (listening on it), as another process could between the launcher's pick and the task's bind.
#: Once MARKER exists (a later start), each task only binds its own port and says so.
TAKE_PORT = r"""
import json, os, socket, subprocess, sys
marker, command = sys.argv[1], sys.argv[3:]
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
address = config["cluster"][task["type"]][task["index"]]
host, port = address.rsplit(":", 1)
with socket.socket() as sock:
    # As gRPC binds (SO_REUSEADDR): a port an earlier connection left in TIME_WAIT is free for it too.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen()
    if os.path.exists(marker):
        print(f"bound {address}", flush=True)
        sys.exit(0)
    if task != {"type": "worker", "index": 1}:
        sock.close()  # not this one: run COMMAND on a free port
    else:
        open(marker, "w").write(address)
    sys.exit(subprocess.run(command).returncode)
"""


def test_a_port_taken_before_the_task_binds_it_starts_every_task_again_on_new_ports(tmp_path):
    """A real tfdist.train finds its port taken (one line, status 2): --local starts every task again, on new ports."""
    take = tmp_path / "take.py"
    take.write_text(TAKE_PORT)
    marker = tmp_path / "taken"
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    command = [sys.executable, str(take), str(marker), "--",
               *train_command("--strategy=multi_worker_mirrored", *SHORT, f"--model_dir={tmp_path / 'run'}")]
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, *command))
        status = proc.wait(120)
    text, taken = proc.text(), marker.read_text()
    assert status == 0, text[-4000:]
    assert f"[worker:1] error: Address already in use: {taken}, the address of worker:1" in text
    assert "[launch] worker:1 found its address in use; stopping every task" in text
    assert "[launch] starting every task again on new ports (retry 1 of 3): worker:1's port was taken" in text
    assert "restarting every task" not in text  # not one of --max_restarts
    for name in ("worker:0", "worker:1"):
        addresses = re.findall(rf"\[launch\] {name} started \(pid \d+\) at (\S+)", text)
        assert len(addresses) == 2 and addresses[0] != addresses[1], addresses
        assert f"[{name}] bound {addresses[1]}" in text  # its new port was free


# --------------------------------------------------------------------------- real tfdist.train tasks


def test_a_diverged_run_is_not_restarted(tmp_path):
    """A real tfdist.train that diverges (status 3) under --max_restarts: a restart would diverge again."""
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=1)
    flags = [f for f in SHORT if not f.startswith("--learning_rate")]
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, *train_command(
            "--strategy=one_device", *flags, "--learning_rate=1e12", f"--model_dir={tmp_path / 'run'}"),
            options=("--max_restarts=2",)))
        status = proc.wait(180)
    text = proc.text()
    assert status == 3, text[-4000:]
    assert re.search(r"^\[worker:0\] error: Training diverged: the loss is (nan|inf) at step \d", text, re.M), text[-3000:]
    assert "[launch] not restarting: status 3 is" in text
    assert "restarting every task" not in text and text.count("[launch] worker:0 started") == 1


def test_ctrl_c_stops_a_training_cluster_and_leaves_no_process_behind(tmp_path):
    """SIGINT to the launcher while two real workers train: status 130, and none of its descendants is left."""
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, *train_command(*MWM, f"--model_dir={tmp_path / 'run'}")))
        proc.wait_for(lambda text: "[worker:0] train  step 5/40" in text, 240, "training")
        seen = descendants(proc.pid)
        proc.popen.send_signal(signal.SIGINT)
        status, after = proc.wait_watching(60)
    text = proc.text()
    assert status == 128 + signal.SIGINT, text[-4000:]
    assert "[launch] received SIGINT; stopping every task" in text
    tasks = every_started_pid(text)
    assert len(tasks) == 2 and tasks <= seen, (tasks, seen)  # the workers were among its descendants
    assert_none_left(seen | after)


def test_tasks_that_end_in_the_same_poll_are_all_told_of(tmp_path):
    """Both workers exit 42 before the launcher looks again (a 6 s poll): both exits are logged, not only the first."""
    cluster = cluster_lib.load_cluster_spec(loopback_cluster(tmp_path / "c.yaml", worker=2))
    out, err = io.BytesIO(), io.BytesIO()
    together = time.time() + 2.0  # both exit at this moment, between two of the launcher's looks
    code = f"import sys, time; time.sleep(max(0.0, {together} - time.time())); sys.exit(42)"
    status = launch.launch(cluster, [sys.executable, "-c", code], local=True, poll=6.0, grace=1.0, out=out, err=err)
    text = err.getvalue().decode() + out.getvalue().decode()
    assert status == 42, text
    assert "[launch] worker:0 exited with status 42" in text and "[launch] worker:1 exited with status 42" in text
