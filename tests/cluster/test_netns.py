"""docs/clusters.md "Several hosts, by hand", for real: each task on a host of its own, in its own network namespace.

Every task is ``python -m tfdist.train --cluster F --task TYPE:I`` started
inside a namespace of its own (``tests/helpers/netns.py``): the cluster spec names
the namespaces' addresses on a private bridge (``10.214.<x>.<i>``), not
127.0.0.1, so every byte between tasks crosses a veth pair and a bridge as
between hosts, and each task has a port space of its own (all listen on the
same port, as on real hosts). Only the namespaces this test made are used,
and they are deleted at the end, passed or not.

multi_worker_mirrored must end with exactly the weights of the same
experiment on 127.0.0.1 (the shared launched run); parameter_server is
asynchronous, so it must do every step, with both workers running closures
and every variable on the ps task.
"""

import json
import time

import pytest

from helpers import netns
from helpers.cluster_runs import MWM, EXPERIMENT, SHARED_RUN, Processes, launched_multi_worker, max_difference, npz_weights, train_command

PORT = 2222  # the same on every host: each namespace has its own ports

_UNAVAILABLE = netns.unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"no network namespaces: {_UNAVAILABLE}")


def _cluster(path, hosts: netns.Hosts, types: list[str]):
    """A cluster spec: task ``i`` of ``types`` on host ``i`` (``hosts.address(i)``), all on ``PORT``."""
    spec: dict[str, list[str]] = {}
    for i, task_type in enumerate(types):
        spec.setdefault(task_type, []).append(f"{hosts.address(i)}:{PORT}")
    path.write_text(json.dumps(spec))
    return path, [(t, len([x for x in types[:i] if x == t])) for i, t in enumerate(types)]


def _run_on_hosts(tmp_path, types: list[str], flags: list[str], timeout: float = 240) -> dict:
    """``tfdist.train flags`` as task ``types[i]`` inside namespace ``i``, for every ``i``; statuses and logs."""
    with netns.Hosts(len(types)) as hosts, Processes(tmp_path) as procs:
        cluster, tasks = _cluster(tmp_path / "cluster.json", hosts, types)
        started = {}
        for i, (task_type, index) in enumerate(tasks):
            name = f"{task_type}:{index}"
            started[name] = procs.start(name.replace(":", "-"), hosts.command(
                i, train_command(f"--cluster={cluster}", f"--task={name}", *flags)))
        deadline = time.monotonic() + timeout  # one bound for all: a task that failed may leave the others waiting
        statuses = {name: proc.wait(max(1.0, deadline - time.monotonic())) for name, proc in started.items()}
        texts = {name: proc.text() for name, proc in started.items()}
        addresses = [hosts.address(i) for i in range(len(types))]
    return {"statuses": statuses, "texts": texts, "addresses": addresses, "cluster": cluster}


def _assert_all_done(run):
    for name, status in run["statuses"].items():
        assert status == 0, f"{name} ended with {status}:\n{run['texts'][name][-3000:]}"
    spec = run["cluster"].read_text()
    assert "127.0.0.1" not in spec and all(a in spec for a in run["addresses"])
    for name, text in run["texts"].items():
        assert "may be reachable from outside" not in text, text[-2000:]  # a private subnet is no public address


@SHARED_RUN
def test_multi_worker_mirrored_on_two_namespaces_matches_127_0_0_1(tmp_path, tmp_path_factory):
    model_dir, weights = tmp_path / "run", tmp_path / "weights"
    run = _run_on_hosts(tmp_path, ["worker", "worker"], [*MWM, f"--model_dir={model_dir}",
                                                         f"--dump_weights={weights}"])
    _assert_all_done(run)
    assert "tfdist: multi_worker_mirrored with 2 replicas, global batch 8, 40 steps" in run["texts"]["worker:0"]
    assert json.loads((model_dir / "summary.json").read_text())["steps"] == 40
    reference = npz_weights(launched_multi_worker(tmp_path_factory)["weights"] / "worker-0.npz")
    for worker in ("worker-0", "worker-1"):
        assert max_difference(npz_weights(weights / f"{worker}.npz"), reference) == 0.0, worker


def test_parameter_server_on_four_namespaces_does_every_step(tmp_path):
    model_dir = tmp_path / "run"
    steps = 12
    flags = [f.replace("steps_per_epoch=40", f"steps_per_epoch={steps}") for f in EXPERIMENT]
    run = _run_on_hosts(tmp_path, ["chief", "worker", "worker", "ps"],
                        ["--strategy=parameter_server", *flags, f"--model_dir={model_dir}"])
    _assert_all_done(run)
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["steps"] == steps  # no worker lost: each scheduled closure ran once
    per_worker = summary["closures_per_worker"]
    assert sorted(per_worker) == ["worker:0", "worker:1"] and all(n > 0 for n in per_worker.values()), per_worker
    assert sum(per_worker.values()) == steps, per_worker
    assert summary["variable_devices"] and all("/job:ps/" in d for d in summary["variable_devices"]), summary
