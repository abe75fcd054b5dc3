"""The communication benchmark's arithmetic: bus bandwidth, the fitted model, the projection, its markdown, collective kinds."""

from __future__ import annotations


import pytest

from tfdist.bench import comm, trace


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
             "seconds": comm.ring_seconds(s, n, alpha=alpha, bus_bytes_per_second=bus)}
            for s in comm.DEFAULT_SIZES]
    fit = comm.fit_cost(rows)
    assert fit["alpha_seconds"] == pytest.approx(alpha, rel=1e-6)
    assert fit["bus_gbps"] == pytest.approx(1.25, rel=1e-6)
    assert fit["rms_residual_seconds"] < 1e-12
    assert comm.fit_cost(rows, relative=False)["alpha_seconds"] == pytest.approx(alpha, rel=1e-6)
    with pytest.raises(ValueError, match="replicas"):
        comm.fit_cost([{**r, "replicas": 1} for r in rows])


def test_projection_efficiency_falls_with_workers_rises_with_link_speed():
    rows = comm.projection_table(compute_seconds=0.1, gradient_bytes=100e6, alpha=20e-6)
    assert len(rows) == 18
    for link in comm.LINKS_GBIT:
        eff = [r["efficiency"] for r in rows if r["link_gbit"] == link]
        assert eff == sorted(eff, reverse=True) and eff[0] > eff[-1]
    for n in comm.WORKERS:
        eff = [r["efficiency"] for r in rows if r["workers"] == n]  # links in rising order
        assert eff == sorted(eff) and eff[0] < eff[-1]
    # By hand: 8 workers, 10 Gbit/s (1.25e9 B/s), 100 MB, alpha 20 µs: 14 * 20e-6 + 1.75 * 0.08 = 0.14028 s.
    one = comm.project(compute_seconds=0.1, gradient_bytes=100e6, workers=8, link_gbit=10, alpha=20e-6)
    assert one["allreduce_seconds"] == pytest.approx(0.14028)
    assert one["efficiency"] == pytest.approx(0.1 / 0.24028)
    half = comm.project(compute_seconds=0.1, gradient_bytes=100e6, workers=8, link_gbit=10, alpha=20e-6,
                              overlap=0.5)
    assert half["efficiency"] == pytest.approx(0.1 / (0.1 + 0.07014))
    # 10 batch-norm-sized all-reduces cost latency only: 10 * 14 * 20 µs = 2.8 ms more.
    bn = comm.project(compute_seconds=0.1, gradient_bytes=100e6, workers=8, link_gbit=10, alpha=20e-6,
                            latency_allreduces=10)
    assert bn["exposed_seconds"] == pytest.approx(0.14028 + 0.0028)


def test_markdown_states_the_model_and_quotes_the_published_points():
    rows = comm.projection_table(compute_seconds=0.1, gradient_bytes=2e6, alpha=20e-6)
    text = "\n".join(comm.projection_markdown(rows, compute_seconds=0.1, gradient_bytes=2e6, alpha_source="stated"))
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

