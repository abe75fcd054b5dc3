"""``python -m tfdist.doctor``'s pure parts and one-line errors: the comparison of versions, GPUs and clocks, the clock offset's sign, the GPUs CUDA_VISIBLE_DEVICES shows, bad flags, an unresolvable host."""

from __future__ import annotations

import re
import socket
import threading
import time
import types

import pytest

from helpers.clis import assert_user_error, cli_argv, run_cli
from tfdist.doctor import cli as doctor_cli
from tfdist.doctor import agree
from tfdist.doctor import meet
from tfdist.cluster.network import free_ports
from tfdist.cluster.spec import parse_cluster_spec
from tfdist.cluster.task import Task


DOCTOR = cli_argv("tfdist.doctor")


#: A task's line in a problem list: ``worker:1 (host:port): ...``.
PROBLEM = re.compile(r"^(\w+:\d+) \(")


def doctor(*args: str, timeout: float = 60):
    """``python -m tfdist.doctor ARGS`` in a fresh process without TF_CONFIG (``run_cli``): (result, seconds)."""
    started = time.monotonic()
    result = run_cli("tfdist.doctor", *args, timeout=timeout)
    return result, time.monotonic() - started


def problem_tasks(text: str) -> list[str]:
    """The tasks named at the start of a problem line, in order."""
    return [m.group(1) for line in text.splitlines() if (m := PROBLEM.match(line))]


def test_probing_names_the_unresolvable_host_and_the_port_in_use_within_10_s(tmp_path):
    held, free_a, free_b = free_ports(3)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"chief: 127.0.0.1:{free_a}\nworker: [nohost.invalid:2222, 127.0.0.1:{held}, "
                       f"localhost:{free_b}]\n")
    with socket.create_server(("127.0.0.1", held)):
        result, seconds = doctor(f"--cluster={cluster}")
        running, _ = doctor(f"--cluster={cluster}", "--running")
    assert result.returncode == 2, result.stdout + result.stderr
    assert seconds < 10
    assert problem_tasks(result.stdout) == ["worker:0", "worker:1"], result.stdout
    lines = result.stdout.splitlines()
    assert "worker:0 (nohost.invalid:2222): the host does not resolve (" in result.stdout
    assert f"worker:1 (127.0.0.1:{held}): port {held} is in use by another process on this machine. Fix: " \
           in result.stdout
    assert re.search(rf"^chief:0 +127\.0\.0\.1:{free_a} +127\.0\.0\.1 +free \(this machine\) +no$", result.stdout, re.M)
    assert lines[-1] == "doctor: 2 problems: the cluster cannot start"
    # --running: the held port answers, the free ones do not
    assert running.returncode == 2
    assert problem_tasks(running.stdout) == ["chief:0", "worker:0", "worker:2"], running.stdout
    assert f"chief:0 (127.0.0.1:{free_a}): nothing answers at 127.0.0.1:{free_a}" in running.stdout


def _report(task: str, **changes) -> agree.Report:
    values = dict(task=task, cluster={"worker": ["a:1", "b:1", "c:1"]}, python="3.11.7", tensorflow="2.21.0",
                  keras="3.15.1", tfdist="0.1.0", gpus=2, model_dir="/shared/run", token="t")
    return agree.Report(**{**values, **changes})


def test_a_mismatch_names_the_task_that_differs():
    names = ["worker:0", "worker:1", "worker:2"]
    reports = {n: _report(n, tensorflow="2.20.0") if n == "worker:1" else _report(n) for n in names}
    observations = {n: agree.Observation(task=n) for n in names}
    compute = agree.compute_tasks(reports["worker:0"].cluster, coordinator=False)
    assert agree.problems(reports, observations, leader="worker:0", compute=compute) == [
        "worker:1 has TensorFlow 2.20.0, the others 2.21.0. Fix: install the same TensorFlow on every host."]
    # GPUs of the computing tasks, a clock 3.2 s ahead, storage that worker:2 does not share
    reports["worker:1"] = _report("worker:1", gpus=1)
    observations["worker:1"] = agree.Observation(task="worker:1", clock_offset=3.2)
    observations["worker:2"] = agree.Observation(task="worker:2", unseen=("worker:0", "worker:1"))
    lines = agree.problems(reports, observations, leader="worker:0", compute=compute)
    assert [line.split(". Fix:")[0] for line in lines] == [
        "worker:1 has 1 GPU, the others 2 GPUs",
        "worker:1's clock is 3.2 s ahead of worker:0's (the leader)",
        "worker:2 does not see what worker:0, worker:1 wrote to --model_dir: worker:2's /shared/run is not the same "
        "storage as theirs (/shared/run)",
    ]
    # a tie goes the leader's way; only computing tasks compare GPUs
    two = {"chief:0": _report("chief:0", keras="3.14.0", gpus=0), "worker:0": _report("worker:0")}
    assert agree.disagreements({t: r.keras for t, r in two.items()}, "chief:0", "Keras") == [
        "worker:0 has Keras 3.15.1, the others 3.14.0"]
    assert agree.compute_tasks({"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]}, coordinator=True) == ["worker:0"]


@pytest.mark.parametrize("offset, said", [
    (3.2, "3.2 s ahead of"), (-3.2, "3.2 s behind"), (-2.5, "2.5 s behind"), (1.9, None), (-1.9, None),
])
def test_a_clock_off_the_leaders_by_more_than_the_limit_is_a_problem_ahead_or_behind(offset, said):
    names = ["worker:0", "worker:1", "worker:2"]
    reports = {n: _report(n) for n in names}
    observations = {n: agree.Observation(task=n, clock_offset=offset if n == "worker:1" else 0.0) for n in names}
    lines = agree.problems(reports, observations, leader="worker:0", compute=names)
    assert lines == ([] if said is None else [f"worker:1's clock is {said} worker:0's (the leader). Fix: run NTP "
                                              "(chrony, systemd-timesyncd) on every host."])
    rows = agree.table(reports, observations, leader="worker:0", addresses={n: "a:1" for n in names})
    assert re.search(rf"^worker:1 .* {re.escape(f'{offset:+.3f}')} s ", "\n".join(rows), re.M), rows
    assert re.search(r"^worker:0 .* leader ", "\n".join(rows), re.M), rows


@pytest.mark.parametrize("leader_ahead", [30.0, -30.0])
def test_the_measured_offset_is_this_tasks_clock_minus_the_leaders(monkeypatch, leader_ahead):
    """The leader's server answers from threads of its own: their clock runs ``leader_ahead`` s off this one's."""
    spec = parse_cluster_spec({"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}, source="test")
    leader, me = Task(spec=spec, type="worker", index=0), Task(spec=spec, type="worker", index=1)
    here, real = threading.current_thread(), time.time
    monkeypatch.setattr(meet, "time", types.SimpleNamespace(
        time=lambda: real() + (0.0 if threading.current_thread() is here else leader_ahead),
        monotonic=time.monotonic, sleep=time.sleep))
    server = meet._Server(leader, _report("worker:0"))
    try:
        offset, trip = meet.clock_offset(me, leader.address)
    finally:
        server.close()
    assert offset is not None and abs(offset + leader_ahead) < trip + 1.0, (offset, trip)


#: The UUIDs of three GPUs in a driver folder made by hand; ``GPU-8f3`` is a prefix of two of them.
UUIDS = ("GPU-8f3a5c1e-1111-4000-8000-000000000000", "GPU-2b7c9d40-2222-4000-8000-000000000001",
         "GPU-8f3b0e77-3333-4000-8000-000000000002")


@pytest.fixture
def three_gpus(tmp_path, monkeypatch):
    """``/proc/driver/nvidia/gpus`` as the NVIDIA driver writes it, with the three GPUs of ``UUIDS``."""
    listed = tmp_path / "gpus"
    for i, uuid in enumerate(UUIDS):
        folder = listed / f"0000:0{i + 1}:00.0"
        folder.mkdir(parents=True)
        (folder / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: \t\t {40 + i}\nGPU UUID: \t "
                                             f"{uuid}\nBus Location: \t 0000:0{i + 1}:00.0\nDevice Minor: \t {i}\n")
    monkeypatch.setattr(doctor_cli, "DRIVER_GPUS", listed)
    return listed


@pytest.mark.parametrize("visible, expected", [
    (None, 3), ("", 0), ("-1", 0), ("-1,0", 0), ("0,2", 2), ("2,0,1", 3), (" 1 , 0", 2), ("0,3,1", 1), ("3", 0),
    ("0,0", 0), ("1,2,1", 0),  # CUDA shows no GPU when one repeats
    ("GPU-8f3a", 1), (f"{UUIDS[1]},GPU-8f3a", 2), (",".join(UUIDS), 3), ("GPU-8f3a,1", 1), ("1,GPU-8f3a", 1),
    ("GPU-dead", 0), ("GPU-8f3", 0), ("GPU-8f3a,GPU-8f3a5c", 0),
])
def test_the_gpus_a_task_counts_are_those_cuda_visible_devices_shows(three_gpus, monkeypatch, visible, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert doctor_cli.driver_gpus() == expected


def test_without_a_driver_no_gpu_and_without_its_uuids_a_uuid_counts(three_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-dead,GPU-beef")
    for folder in three_gpus.iterdir():
        (folder / "information").unlink()  # UUIDs unknown: each UUID entry is taken for a GPU of this machine
    assert doctor_cli.driver_gpus() == 2
    monkeypatch.setattr(doctor_cli, "DRIVER_GPUS", three_gpus / "absent")
    for visible in ("0", "GPU-dead", ""):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert doctor_cli.driver_gpus() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert doctor_cli.driver_gpus() == 0


@pytest.mark.parametrize("args, expected", [
    (["--bogus"], "error: invalid command line: Unknown command line flag 'bogus'"),
    (["--cluster=configs/clusters/local_mwm.yaml", "--task=worker:0", "--running"], "error: Unexpected `--running`"),
    (["--cluster=configs/clusters/local_mwm.yaml", "--model_dir=/tmp/x"], "error: Unexpected `--model_dir`"),
    (["--cluster=configs/clusters/local_mwm.yaml", "--task=worker:7"], "error: Invalid value for `--task`"),
    (["--devices=gpu"], "error: invalid command line: flag --devices=gpu"),
    ([], "error: Missing `--cluster`"),
    (["--cluster=configs/clusters/local_mwm.yaml", "--task=worker:0", "--connect_timeout=nan"],
     "error: invalid command line: flag --connect_timeout=nan: --connect_timeout must be a finite number"),
    (["--cluster=configs/clusters/local_mwm.yaml", "--task=worker:0", "--connect_timeout=inf"],
     "error: invalid command line: flag --connect_timeout=inf: --connect_timeout must be a finite number"),
    (["--cluster=configs/clusters/local_mwm.yaml", "--task=worker:0", "--model_dir=README.md"],
     "error: Invalid value for `--model_dir`: not a directory. Received: 'README.md', an existing file."),
    (["--cluster=configs/clusters/local_mwm.yaml", "--task=worker:0", "--model_dir=README.md/run"],
     "error: Invalid value for `--model_dir`: README.md is a file. Received: 'README.md/run'."),
])
def test_bad_flags_are_one_line_and_status_2(args, expected):
    result, _ = doctor(*args, timeout=30)
    assert_user_error(result, "^" + re.escape(expected))

