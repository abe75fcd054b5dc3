"""``python -m tfdist.doctor``: a cluster probed from one host, and the tasks of a cluster meeting.

Probing (no task): an unresolvable host (the reserved ``.invalid`` TLD never
resolves, and sends nothing anywhere), a port held by this test on
127.0.0.1, and, inside network namespaces of our own (``tests/helpers/netns.py``,
root only), a remote port that is refused (free: good), one that something
listens on, and an address of the namespaces' subnet that no namespace holds
(a connect that never gets an answer: "filtered or down"). Each bad task is
named on one line, within 10 s.

Meeting (a task): real processes on 127.0.0.1, under ``tfdist.launch
--local`` (every task prints the same report and exits 0), started by hand
with a ``--model_dir`` of their own each (both exit 2 naming the storage),
and one task alone (its missing peer named). What a task reports cannot be
changed from outside, so the comparison of versions, GPUs and clocks is
checked as the pure function it is (``cluster.agree.problems``): a clock off
the leader's by more than the limit is a problem whether it is ahead or
behind. The offset's sign is measured against a leader's server whose clock
is off by a known amount, and the GPUs a task counts from the driver are
checked against CUDA's reading of ``CUDA_VISIBLE_DEVICES`` over a driver
folder made by hand.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from helpers import netns
from helpers.clis import REPO, child_env, python_argv
from helpers.cluster_runs import Processes, launcher, loopback_cluster
from unit.test_doctor import DOCTOR, doctor, problem_tasks


def test_probing_a_good_cluster_with_a_strategy_that_does_not_fit(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    result, _ = doctor(f"--cluster={cluster}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "doctor: the cluster can start"
    result, _ = doctor(f"--cluster={cluster}", "--strategy=parameter_server")
    assert result.returncode == 2
    assert "--strategy=parameter_server: Invalid cluster for strategy='parameter_server'" in result.stdout


_NO_NETNS = netns.unavailable()


@pytest.mark.skipif(_NO_NETNS is not None, reason=f"no network namespaces: {_NO_NETNS}")
def test_probing_from_a_namespace_names_the_filtered_port_and_the_remote_listener(tmp_path):
    port, taken = 2222, 2223
    with netns.Hosts(2) as hosts, Processes(tmp_path) as procs:
        nobody = hosts.address(0).rsplit(".", 1)[0] + ".250"  # on the subnet, held by no namespace
        cluster = tmp_path / "c.yaml"
        cluster.write_text(f"worker: [{hosts.address(0)}:{port}, {hosts.address(1)}:{port}, {nobody}:{port}, "
                           f"{hosts.address(1)}:{taken}]\n")
        listener = procs.start("listener", hosts.command(1, python_argv(
            f"import socket, time; s = socket.create_server(('', {taken})); print('up', flush=True); time.sleep(60)")))
        listener.wait_for(lambda text: "up" in text, 30, "the listener in namespace 1")
        started = time.monotonic()
        result = subprocess.run(hosts.command(0, [*DOCTOR, f"--cluster={cluster}"]), capture_output=True, text=True,
                                timeout=30, env=child_env(), cwd=REPO)
        seconds = time.monotonic() - started
    assert result.returncode == 2, result.stdout + result.stderr
    assert seconds < 10
    assert problem_tasks(result.stdout) == ["worker:2", "worker:3"], result.stdout
    assert (f"worker:2 ({nobody}:{port}): the port is closed (filtered by a firewall) or the host is down"
            in result.stdout)
    assert f"worker:3 ({hosts.address(1)}:{taken}): something already listens on" in result.stdout
    assert re.search(r"^worker:0 .* free \(this machine\) +no$", result.stdout, re.M)  # namespace 0 is "here"
    assert re.search(rf"^worker:1 +{re.escape(hosts.address(1))}:{port} .* free +no$", result.stdout, re.M)


def _reports_by_task(text: str) -> dict[str, list[str]]:
    """Each launched task's lines from its ``doctor: TASK met`` line on (prefix removed), head line excluded."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^\[(\w+:\d+)\] (.*)$", line)
        if not match:
            continue
        task, rest = match.groups()
        if rest.startswith(f"doctor: {task} met "):
            found[task] = [rest]
        elif task in found:
            found[task].append(rest)
    return found


def test_a_launched_cluster_meets_and_every_task_prints_the_same_report(tmp_path):
    model_dir = tmp_path / "run"
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(REPO / "configs/clusters/local_mwm.yaml", *DOCTOR,
                                              f"--model_dir={model_dir}"))
        status = proc.wait(120)
    text = proc.text()
    assert status == 0, text[-3000:]
    reports = _reports_by_task(text)
    assert sorted(reports) == ["worker:0", "worker:1"], text[-3000:]
    head, *report = reports["worker:0"]
    assert reports["worker:1"][1:] == report
    assert float(re.search(r" in ([0-9.]+) s \(", head).group(1)) < 10
    assert report[-1] == "doctor: every task agrees: the cluster can start"
    assert re.search(rf"^worker:1 +127\.0\.0\.1:\d+ .* 0 +[-+]0\.\d{{3}} s +{re.escape(str(model_dir))} \(shared\)$",
                     "\n".join(report), re.M), report
    assert not (model_dir / ".tfdist-doctor").exists()  # every token cleaned up


def test_tasks_whose_model_dirs_are_not_shared_both_exit_2_naming_the_storage(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    with Processes(tmp_path) as procs:
        started = {f"worker:{i}": procs.start(f"worker-{i}", [*DOCTOR, f"--cluster={cluster}", f"--task=worker:{i}",
                                                               f"--model_dir={tmp_path / f'dir{i}'}", "--devices=driver"])
                   for i in (0, 1)}
        statuses = {name: proc.wait(60) for name, proc in started.items()}
    texts = {name: proc.text() for name, proc in started.items()}
    assert statuses == {"worker:0": 2, "worker:1": 2}, texts
    for observer, other in (("worker:0", 1), ("worker:1", 0)):
        line = (f"{observer} does not see what worker:{other} wrote to --model_dir: {observer}'s "
                f"{tmp_path / f'dir{observer[-1]}'} is not the same storage as theirs ({tmp_path / f'dir{other}'})")
        assert all(line in text for text in texts.values()), texts
    assert texts["worker:0"].splitlines()[1:] == texts["worker:1"].splitlines()[1:]  # the same report


def test_a_task_that_never_shows_up_is_named(tmp_path):
    cluster = loopback_cluster(tmp_path / "c.yaml", worker=2)
    absent = cluster.read_text().split(", ")[1].rstrip("]\n")
    result, seconds = doctor(f"--cluster={cluster}", "--task=worker:0", "--connect_timeout=1", "--devices=none")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"worker:1 ({absent}): never answered within --connect_timeout=1s (connection refused)" in result.stdout
    assert re.search(r"^worker:1 .*\(never answered\)$", result.stdout, re.M)
    assert seconds < 10


