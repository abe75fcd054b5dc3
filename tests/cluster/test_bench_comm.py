"""The all-reduce measurements and their projection (``tfdist.bench.comm``), and the collectives' share of a
traced step (``trace``).

Pure functions on known numbers first; then one real 2-worker
``multi_worker_mirrored`` cluster (two processes on 127.0.0.1, about 40 s on
2 cores) that runs a small sweep and traces two real UNet train steps, shared
by the tests that read its results.
"""

from __future__ import annotations

import sys

import pytest

from tfdist.bench import children, comm


# --- pure functions -----------------------------------------------------------------------------


# --- a real 2-worker cluster --------------------------------------------------------------------

WORKER = """
import json, os, sys
from tfdist.strategies import make_strategy, setup_host
setup_host(inter_op_threads=4)
strategy = make_strategy("multi_worker_mirrored")
from tfdist.bench import comm, trace
from tfdist.bench.rows import Measured
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
sweep = comm.sweep(strategy, [4 << 10, 4 << 20], warmup=2, iterations=5)
logdir = os.path.join(sys.argv[1], f"trace{index}")
ran = trace.profile(trace.unet_step(strategy), 2, logdir, warmup=2)
share = {**trace.collective_share(logdir, 2), "wall_seconds_per_step": ran["wall_seconds_per_step"]}
print(Measured(name=f"worker{index}", details={"sweep": sweep, "share": share}).to_line(), flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Each worker's ``{"sweep": ..., "share": ...}`` from one 2-worker run (``children.run_cluster``: bounded,
    every process killed, run again if TensorFlow's profiler crashes as it stops)."""
    tmp = tmp_path_factory.mktemp("comm")
    per_worker = children.run_cluster(lambda: [sys.executable, "-c", WORKER, str(tmp)], 2, timeout=240)
    assert [results[0].name for results in per_worker] == ["worker0", "worker1"]
    return [results[0].details for results in per_worker]


def test_sweep_on_two_workers(cluster):
    for result in cluster:
        small, big = result["sweep"]
        for row in (small, big):
            assert row["replicas"] == 2 and row["seconds"] > 0
            assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["seconds"] / 1e9)
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])  # 2(n-1)/n = 1 for n = 2
        assert big["seconds"] > small["seconds"]  # 1024 times the bytes
    fit = comm.fit_cost(cluster[0]["sweep"])
    assert fit["bus_gbps"] > 0 and fit["alpha_seconds"] >= 0


def test_collective_share_of_a_real_step(cluster):
    for result in cluster:
        share = result["share"]
        assert share["steps"] == 2 and share["step_seconds"] > 0
        assert share["count_per_step"] > 0 and 0 < share["share"] < 1
        assert share["count_per_step"] == sum(k["count_per_step"] for k in share["by_kind"].values())
        assert share["op_seconds_per_step"] >= share["collective_seconds_per_step"]
        assert share["collective_seconds_per_step"] < share["step_seconds"]
        kinds = share["by_kind"]
        assert kinds["gradient"]["count_per_step"] >= 1  # the optimizer's packed gradient all-reduce
        assert kinds["batch_norm"]["count_per_step"] == 10  # 1 per ReplicaBatchNorm (its statistics), 10 layers at depth 2
        assert "CollectiveReduceV2" in share["types"]
