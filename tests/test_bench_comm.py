"""The all-reduce measurements (``tfdist.bench.comm``, ``trace``) and their projection (``projection``).

Pure functions on known numbers first; then one real 2-worker
``multi_worker_mirrored`` cluster (two processes on 127.0.0.1, about 40 s on
2 cores) that runs a small sweep and traces two real UNet train steps, shared
by the tests that read its results.
"""

from __future__ import annotations

import sys

import pytest

from tfdist.bench import children, comm, projection, trace


# --- pure functions -----------------------------------------------------------------------------


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    assert comm.bus_factor(2) == 1.0
    assert comm.bus_factor(8) == pytest.approx(1.75)
    bw = comm.bandwidths(8_000_000, 0.004, 4)  # 2 GB/s algorithm bandwidth, x 1.5 on the bus
    assert bw["algbw_gbps"] == pytest.approx(2.0)
    assert bw["busbw_gbps"] == pytest.approx(3.0)


def test_fit_recovers_alpha_and_bandwidth_from_synthetic_times():
    alpha, bus = 50e-6, 1.25e9  # 50 µs per step, 10 Gbit/s
    n = 4
    rows = [{"bytes": s, "replicas": n,
             "seconds": projection.ring_seconds(s, n, alpha=alpha, bus_bytes_per_second=bus)}
            for s in comm.DEFAULT_SIZES]
    fit = projection.fit_cost(rows)
    assert fit["alpha_seconds"] == pytest.approx(alpha, rel=1e-6)
    assert fit["bus_gbps"] == pytest.approx(1.25, rel=1e-6)
    assert fit["rms_residual_seconds"] < 1e-12
    assert projection.fit_cost(rows, relative=False)["alpha_seconds"] == pytest.approx(alpha, rel=1e-6)
    with pytest.raises(ValueError, match="replicas"):
        projection.fit_cost([{**r, "replicas": 1} for r in rows])


def test_projection_efficiency_falls_with_workers_rises_with_link_speed():
    rows = projection.table(compute_seconds=0.1, gradient_bytes=100e6, alpha=20e-6)
    assert len(rows) == 18
    for link in projection.LINKS_GBIT:
        eff = [r["efficiency"] for r in rows if r["link_gbit"] == link]
        assert eff == sorted(eff, reverse=True) and eff[0] > eff[-1]
    for n in projection.WORKERS:
        eff = [r["efficiency"] for r in rows if r["workers"] == n]  # links in rising order
        assert eff == sorted(eff) and eff[0] < eff[-1]
    # By hand: 8 workers, 10 Gbit/s (1.25e9 B/s), 100 MB, alpha 20 µs: 14 * 20e-6 + 1.75 * 0.08 = 0.14028 s.
    one = projection.project(compute_seconds=0.1, gradient_bytes=100e6, workers=8, link_gbit=10, alpha=20e-6)
    assert one["allreduce_seconds"] == pytest.approx(0.14028)
    assert one["efficiency"] == pytest.approx(0.1 / 0.24028)
    half = projection.project(compute_seconds=0.1, gradient_bytes=100e6, workers=8, link_gbit=10, alpha=20e-6,
                              overlap=0.5)
    assert half["efficiency"] == pytest.approx(0.1 / (0.1 + 0.07014))
    # 10 batch-norm-sized all-reduces cost latency only: 10 * 14 * 20 µs = 2.8 ms more.
    bn = projection.project(compute_seconds=0.1, gradient_bytes=100e6, workers=8, link_gbit=10, alpha=20e-6,
                            latency_allreduces=10)
    assert bn["exposed_seconds"] == pytest.approx(0.14028 + 0.0028)


def test_markdown_states_the_model_and_quotes_the_published_points():
    rows = projection.table(compute_seconds=0.1, gradient_bytes=2e6, alpha=20e-6)
    text = "\n".join(projection.markdown(rows, compute_seconds=0.1, gradient_bytes=2e6, alpha_source="stated"))
    assert "2(n-1)·alpha + 2(n-1)/n · S / B" in text and "not a measurement" in text
    assert "90%" in text and "6.35x" in text and "4.72x" in text and "as published" in text
    assert "| 256 |" in text
    section = {"replicas": 2, "memcpy_gbps": 4.0,
               "sweep": [{"bytes": 1 << 20, "seconds": 0.01, "replicas": 2, **comm.bandwidths(1 << 20, 0.01, 2)}]}
    lines = comm.markdown(section)
    assert "2(n-1)/n" in lines[0] and "| 1 MB | 0.010000 | 0.105 | 0.105 | 0.026 |" in lines


def test_collective_kinds_from_op_names():
    assert trace.kind("unet_unet_1/down0_1_bn_1/CollectiveReduceV2_2") == "batch_norm"
    assert trace.kind("sgd_1/CollectiveReduceV2") == "gradient"
    assert trace.kind("CollectiveReduceV2_10") == "unscoped"
    assert trace.is_collective("CollectiveReduceV2") and not trace.is_collective("Conv2D")
    assert trace._union_ps([(0, 10), (5, 20), (30, 40)]) == 30


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
share = trace.traced_unet(strategy, os.path.join(sys.argv[1], f"trace{index}"), steps=2, warmup=2)
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
    fit = projection.fit_cost(cluster[0]["sweep"])
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
