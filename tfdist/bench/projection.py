"""Beyond this machine, on paper: the alpha-beta model of ring all-reduce, fitted to a measured sweep and
projected to more workers and faster links.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

#: Workers and link rates (Gbit/s) of the projection table.
WORKERS = (8, 16, 32, 64, 128, 256)
LINKS_GBIT = (10, 25, 100)

#: A stated datacenter latency per ring step (seconds), for when this machine's fit is not wanted:
#: an assumption of the order of a TCP round within one datacenter, not a measurement.
DATACENTER_ALPHA_SECONDS = 20e-6

#: Published scaling results, quoted as published (not measured by tfdist).
PUBLISHED = (
    "Horovod (Sergeev & Del Balso 2018, arXiv:1802.05799): 90% scaling efficiency for ResNet-101 "
    "(and Inception V3) on 512 GPUs, 68% for VGG-16.",
    "NVIDIA DeepLearningExamples, TensorFlow2/Segmentation/UNet_Medical README (DGX A100, 8 x A100 40GB, "
    "batch 8 per GPU): weak scaling 6.35x in TF32 and 4.72x with AMP on 8 GPUs (79% and 59% efficiency), "
    "over NVLink within one machine.",
)


def ring_seconds(num_bytes: float, n: int, *, alpha: float, bus_bytes_per_second: float) -> float:
    """The model's time of one ring all-reduce: ``2(n-1) alpha + 2(n-1)/n * bytes / B`` (0 for one worker)."""
    if n < 1:
        raise ValueError(f"Invalid value for `n`. Received: n={n}. Expected an integer >= 1.")
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * num_bytes / bus_bytes_per_second


def fit_cost(sweep_rows: Sequence[Mapping[str, Any]], *, replicas: int | None = None,
             relative: bool = True) -> dict[str, Any]:
    """Fit ``alpha`` and ``B`` of the ring model to a measured sweep by least squares.

    ``t = alpha * 2(n-1) + (1/B) * 2(n-1)/n * bytes`` is linear in ``alpha``
    and ``1/B``, so least squares over the rows' ``seconds`` solves both;
    ``alpha`` holds all per-call overhead (``tf.function`` dispatch
    included). By default each row's error counts relative to its time
    (weights ``1/t``): in plain least squares (``relative=False``) the
    largest message decides everything, and one slow point of the largest
    size leaves ``alpha`` at 0. A negative
    ``alpha`` (noise) is refitted as 0 with ``B`` alone.

    Args:
      sweep_rows: ``comm.sweep``'s dicts (``bytes``, ``seconds``, ``replicas``); 2 sizes at least.
      replicas: n, where the rows do not say.
      relative: minimise relative (True) or absolute (False) squared errors.

    Returns:
      ``alpha_seconds``, ``bus_gbps`` (B in GB/s, 1e9 bytes/s), ``replicas``, ``points``,
      ``relative`` and ``rms_residual_seconds`` (the fit's absolute error over the rows).

    Raises:
      ValueError: fewer than 2 sizes, one replica, or times that do not grow with the size.
    """
    n = replicas or (sweep_rows[0].get("replicas") if sweep_rows else None)
    if not n or n < 2:
        raise ValueError(f"Invalid value for `replicas`. Received: replicas={n}. Expected an integer >= 2.")
    if len({row["bytes"] for row in sweep_rows}) < 2:
        raise ValueError(f"fit_cost needs 2 message sizes at least. Received: {len(sweep_rows)} rows.")
    a = 2.0 * (n - 1)
    xs = [2.0 * (n - 1) / n * row["bytes"] for row in sweep_rows]
    ts = [float(row["seconds"]) for row in sweep_rows]
    k = len(xs)
    ws = [1.0 / t**2 if relative else 1.0 for t in ts]
    # Weighted normal equations of t = alpha * a + inv_b * x.
    sw = sum(ws)
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sx = sum(w * x for w, x in zip(ws, xs))
    st = sum(w * t for w, t in zip(ws, ts))
    sxt = sum(w * x * t for w, x, t in zip(ws, xs, ts))
    det = (a * a * sw) * sxx - (a * sx) ** 2
    alpha = (sxx * a * st - a * sx * sxt) / det
    inv_b = (a * a * sw * sxt - a * sx * a * st) / det
    if alpha < 0:
        alpha, inv_b = 0.0, sxt / sxx
    if inv_b <= 0:
        raise ValueError("The sweep's times do not grow with the message size: no bandwidth term to fit.")
    residuals = [t - (alpha * a + inv_b * x) for x, t in zip(xs, ts)]
    return {"alpha_seconds": alpha, "bus_gbps": 1.0 / inv_b / 1e9, "replicas": n, "points": k, "relative": relative,
            "rms_residual_seconds": (sum(r * r for r in residuals) / k) ** 0.5}


def project(*, compute_seconds: float, gradient_bytes: float, workers: int, link_gbit: float, alpha: float,
            overlap: float = 0.0, latency_allreduces: int = 0) -> dict[str, Any]:
    """The model's step time and scaling efficiency for ``workers`` on a ``link_gbit`` Gbit/s link.

    Weak scaling (each worker keeps its batch, so ``compute_seconds`` stays):
    the all-reduce of ``gradient_bytes`` is ``ring_seconds`` with
    ``B = link_gbit / 8`` GB/s, of which ``overlap`` (0..1) is hidden behind
    the backward pass; ``efficiency = compute / (compute + (1 - overlap) * all-reduce)``.
    ``latency_allreduces`` adds that many all-reduces too small for their
    bytes to count, each ``2(n-1) alpha`` and not overlapped: batch norm's
    (``trace.collective_share``'s ``batch_norm`` and ``unscoped`` counts;
    57 per step for the benchmark's UNet), which a ring pays for in latency.

    Returns:
      ``workers``, ``link_gbit``, ``bus_gbps``, ``alpha_seconds``, ``allreduce_seconds``,
      ``exposed_seconds``, ``step_seconds``, ``efficiency`` and ``speedup`` (workers x efficiency).
    """
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"Invalid value for `overlap`. Received: overlap={overlap}. Expected 0 <= overlap <= 1.")
    bus = link_gbit / 8.0 * 1e9
    allreduce = ring_seconds(gradient_bytes, workers, alpha=alpha, bus_bytes_per_second=bus)
    exposed = (1.0 - overlap) * allreduce + latency_allreduces * ring_seconds(0.0, workers, alpha=alpha,
                                                                               bus_bytes_per_second=bus)
    step = compute_seconds + exposed
    efficiency = compute_seconds / step
    return {"workers": workers, "link_gbit": link_gbit, "bus_gbps": bus / 1e9, "alpha_seconds": alpha,
            "allreduce_seconds": allreduce, "latency_allreduces": latency_allreduces,
            "exposed_seconds": exposed, "step_seconds": step,
            "efficiency": efficiency, "speedup": workers * efficiency}


def table(*, compute_seconds: float, gradient_bytes: float, alpha: float, overlap: float = 0.0,
          latency_allreduces: int = 0, workers: Sequence[int] = WORKERS,
          links_gbit: Sequence[float] = LINKS_GBIT) -> list[dict[str, Any]]:
    """``project`` for every link rate and worker count (links outer, workers inner)."""
    return [project(compute_seconds=compute_seconds, gradient_bytes=gradient_bytes, workers=n, link_gbit=link,
                    alpha=alpha, overlap=overlap, latency_allreduces=latency_allreduces)
            for link in links_gbit for n in workers]


def markdown(rows: Sequence[Mapping[str, Any]], *, compute_seconds: float, gradient_bytes: float,
             alpha_source: str = "", overlap: float = 0.0) -> list[str]:
    """Report lines: the model and its assumptions, efficiency per workers x link, and the published results.

    ``rows`` are ``table``'s; ``alpha_source`` says where alpha came from
    (this machine's ``fit_cost``, or ``DATACENTER_ALPHA_SECONDS``).
    """
    if not rows:
        return []
    alpha = rows[0]["alpha_seconds"]
    links = sorted({row["link_gbit"] for row in rows})
    counts = sorted({row["workers"] for row in rows})
    cell = {(row["workers"], row["link_gbit"]): row for row in rows}
    lines = [
        "Projection (a model, not a measurement): ring all-reduce t(S, n) = 2(n-1)·alpha + 2(n-1)/n · S / B;",
        f"efficiency = compute / (compute + (1 - overlap) · t). compute = {compute_seconds * 1e3:.3g} ms per step "
        f"(weak scaling: each worker keeps its batch), S = {gradient_bytes / 1e6:.3g} MB of gradients, "
        f"alpha = {alpha * 1e6:.3g} µs per ring step{f' ({alpha_source})' if alpha_source else ''}, "
        f"overlap = {overlap:g}, plus {rows[0].get('latency_allreduces', 0)} small all-reduces per step "
        "(batch norm's) at 2(n-1)·alpha each.",
        "Assumptions: one ring over all workers, each with one full-duplex link at the stated rate "
        "(B = link / 8 bytes/s), no contention, no congestion and no other traffic; the gradients in one "
        "all-reduce per step; input reading left out.",
        "",
        "| workers | " + " | ".join(f"{link:g} Gbit/s: eff. (step ms)" for link in links) + " |",
        "|---:|" + "---:|" * len(links),
    ]
    for n in counts:
        cells = [f"{cell[n, link]['efficiency']:.1%} ({cell[n, link]['step_seconds'] * 1e3:.3g})"
                 if (n, link) in cell else "-" for link in links]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "Published reference points (quoted as published, not measured here):"]
    lines += [f"- {text}" for text in PUBLISHED]
    return lines
