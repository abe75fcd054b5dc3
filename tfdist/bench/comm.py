"""All-reduce against its limit: message-size sweeps, packing choices and this machine's memory copy, in
nccl-tests' terms, measured inside each worker of a ``multi_worker_mirrored`` cluster; and beyond this machine,
on paper, the alpha-beta model of ring all-reduce fitted to such a sweep and projected to more workers and
faster links.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping, Sequence

#: The default message sizes: 64 KB to 64 MB in powers of 4 (nccl-tests' sweep, shortened).
DEFAULT_SIZES = tuple(64 << 10 << (2 * i) for i in range(6))

#: The ``pack_sweep`` choices: TensorFlow's default (one pack of every gradient), then packs of a fixed size.
#: ``nccl`` is left out: on CPUs TF 2.21 accepts it without error, but there is no NCCL there.
DEFAULT_PACK_OPTIONS = (
    {"communication": "auto", "bytes_per_pack": 0},
    {"communication": "ring", "bytes_per_pack": 0},
    {"communication": "ring", "bytes_per_pack": 256 << 10},
    {"communication": "ring", "bytes_per_pack": 1 << 20},
    {"communication": "ring", "bytes_per_pack": 4 << 20},
)


def bus_factor(n: int) -> float:
    """``2(n-1)/n``: nccl-tests' factor from algorithm to bus bandwidth for an all-reduce of ``n`` ranks."""
    if n < 1:
        raise ValueError(f"Invalid value for `n`. Received: n={n}. Expected an integer >= 1.")
    return 2.0 * (n - 1) / n


def bandwidths(num_bytes: int, seconds: float, n: int) -> dict[str, float]:
    """``algbw_gbps`` (bytes / seconds / 1e9) and ``busbw_gbps`` (algbw * 2(n-1)/n) of one all-reduce."""
    algbw = num_bytes / seconds / 1e9
    return {"algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(n)}


def _median_seconds(call, warmup: int, iterations: int) -> float:
    """Median wall time of ``call()`` over ``iterations`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _finished(strategy, result) -> None:
    """Wait for ``result`` (per replica) by fetching it: a returned tensor is only scheduled, not done."""
    import tensorflow as tf

    for local in strategy.experimental_local_results(result):
        tf.nest.map_structure(lambda t: t.numpy(), local)


def _reduce_fn(strategy, tensors, options=None):
    """A ``tf.function`` that all-reduces (SUM) ``tensors`` on every replica; returns one element of each.

    Returning a 1-element slice keeps the fetch that proves the all-reduce
    finished from adding a copy of the whole message to its time.
    """
    import tensorflow as tf

    def replica():
        values = [t.read_value() for t in tensors]
        reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values, options=options)
        return [tf.reshape(r, [-1])[:1] for r in reduced]

    return tf.function(lambda: strategy.run(replica))


def _random_variables(shapes: Sequence[Sequence[int]], seed: int = 0):
    """Float32 variables of ``shapes`` holding random values (variables, so no all-reduce is constant-folded)."""
    import tensorflow as tf

    generator = tf.random.Generator.from_seed(seed)
    return [tf.Variable(generator.uniform(list(shape)), trainable=False) for shape in shapes]


def collective_ops(function) -> int:
    """Collective all-reduce ops in the graph of a ``tf.function`` called without arguments (its packs)."""
    graph = function.get_concrete_function().graph
    return sum(1 for op in graph.get_operations() if op.type.startswith("CollectiveReduce"))


def sweep(strategy, sizes_bytes: Sequence[int] = DEFAULT_SIZES, *, warmup: int = 3,
          iterations: int = 10) -> list[dict[str, Any]]:
    """Time one all-reduce (SUM) of a float32 message of each size across ``strategy``'s replicas.

    Each message is a variable of ``size / 4`` random floats, reduced inside a
    ``tf.function`` through ``strategy.run`` and the replica context's
    ``all_reduce``; a call is timed until its result is fetched. The time
    includes one ``tf.function`` call (about 0.1 ms), which the latency term
    of ``fit_cost`` absorbs.

    Args:
      strategy: a ``tf.distribute`` strategy; under ``multi_worker_mirrored``
        every worker calls this with the same arguments.
      sizes_bytes: message sizes in bytes (multiples of 4).
      warmup: untimed calls per size (the first traces the function).
      iterations: timed calls per size; the median is reported.

    Returns:
      One dict per size: ``bytes``, ``seconds`` (median of one all-reduce),
      ``algbw_gbps``, ``busbw_gbps`` and ``replicas`` (n).
    """
    n = strategy.num_replicas_in_sync
    rows = []
    for size in sizes_bytes:
        (message,) = _random_variables([[max(1, int(size) // 4)]])
        function = _reduce_fn(strategy, [message])
        seconds = _median_seconds(lambda: _finished(strategy, function()), warmup, iterations)
        rows.append({"bytes": int(size), "seconds": seconds, **bandwidths(int(size), seconds, n), "replicas": n})
    return rows


def memcpy_gbps(size_bytes: int = 64 << 20, repeats: int = 5) -> float:
    """This machine's memory-copy bandwidth: bytes copied per second (GB/s), best of ``repeats``.

    ``numpy.copyto`` of ``size_bytes`` into a preallocated buffer (one core).
    Each byte copied counts once: STREAM's "copy" counts it twice (a read and
    a write) and would report double. Counted once, it compares with
    ``busbw_gbps``, which also counts each byte once per rank, and it bounds
    a loopback all-reduce from above, since a transport over sockets copies
    every byte at least once (gRPC: into a message, into the kernel, out of it).
    """
    import numpy as np

    src = np.random.default_rng(0).random(max(1, size_bytes // 8))
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages before timing
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(max(1, repeats)))
    return src.nbytes / best / 1e9


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def pack_sweep(strategy, gradient_shapes: Sequence[Sequence[int]],
               options: Sequence[Mapping[str, Any]] = DEFAULT_PACK_OPTIONS, *, warmup: int = 2,
               iterations: int = 5) -> list[dict[str, Any]]:
    """Time the all-reduce of a model's gradients (float32, ``gradient_shapes``) under each packing option.

    A ``multi_worker_mirrored`` strategy can be made only once per process,
    so the options are not the strategy's: each is passed to the
    ``all_reduce`` call itself (``options=CommunicationOptions``), which
    TensorFlow merges over the strategy's own. The merge keeps the
    strategy's value where the call's is TensorFlow's default (``auto``,
    ``bytes_per_pack`` 0), so the strategy should be made with its defaults
    (``make_strategy("multi_worker_mirrored")``) for every row to mean what it
    says. ``packs`` (the collective ops in the traced graph) shows the option
    was honoured: 1 with ``bytes_per_pack`` 0, more with smaller packs.

    Args:
      strategy: the strategy (its options at TensorFlow's defaults).
      gradient_shapes: the shapes of the model's trainable variables.
      options: dicts of ``communication`` ("auto", "ring", "nccl") and
        ``bytes_per_pack`` (0: one pack), as ``--communication`` and
        ``--bytes_per_pack`` take them.
      warmup, iterations: untimed and timed calls per option (median).

    Returns:
      One dict per option: ``communication``, ``bytes_per_pack``, ``packs``,
      ``bytes`` (all gradients), ``seconds``, ``algbw_gbps``, ``busbw_gbps``,
      and ``fastest`` (True on the row with the smallest ``seconds``).
    """
    from tfdist.strategies import communication_options

    n = strategy.num_replicas_in_sync
    grads = _random_variables(gradient_shapes, seed=1)
    total = sum(int(g.shape.num_elements()) * 4 for g in grads)
    rows = []
    for option in options:
        chosen = {"communication": option.get("communication", "auto"),
                  "bytes_per_pack": int(option.get("bytes_per_pack", 0))}
        function = _reduce_fn(strategy, grads, communication_options(**chosen))
        packs = collective_ops(function)
        seconds = _median_seconds(lambda: _finished(strategy, function()), warmup, iterations)
        rows.append({**chosen, "packs": packs, "bytes": total, "seconds": seconds, **bandwidths(total, seconds, n)})
    best = min(range(len(rows)), key=lambda i: rows[i]["seconds"]) if rows else None
    for i, row in enumerate(rows):
        row["fastest"] = i == best
    return rows


def measure(strategy, sizes_bytes: Sequence[int] = DEFAULT_SIZES, *, gradient_shapes=None,
            options: Sequence[Mapping[str, Any]] = DEFAULT_PACK_OPTIONS, warmup: int = 3,
            iterations: int = 10) -> dict[str, Any]:
    """The whole section a worker reports: ``replicas``, ``memcpy_gbps``, ``sweep`` and (with shapes) ``packs``.

    One call for a benchmark child; ``markdown`` turns its result into table lines.
    """
    section: dict[str, Any] = {
        "replicas": strategy.num_replicas_in_sync,
        "memcpy_gbps": memcpy_gbps(),
        "sweep": sweep(strategy, sizes_bytes, warmup=warmup, iterations=iterations),
    }
    if gradient_shapes is not None:
        section["packs"] = pack_sweep(strategy, gradient_shapes, options)
    return section


def _size(num_bytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:g} {unit}"
    return f"{num_bytes} B"


def markdown(section: Mapping[str, Any]) -> list[str]:
    """Table lines for the report from ``measure``'s dict (``sweep`` rows; ``memcpy_gbps`` and ``packs`` if there).

    The sweep's columns: message size, seconds, algbw, busbw, and busbw as a
    share of this machine's memory copy (each byte counted once in both).
    """
    memcpy = section.get("memcpy_gbps")
    n = section.get("replicas") or (section["sweep"][0]["replicas"] if section.get("sweep") else "?")
    lines = [f"All-reduce (SUM, float32) across {n} replicas; busbw = algbw x 2(n-1)/n (nccl-tests)."
             + (f" Memory copy on this machine: {memcpy:.2f} GB/s (bytes copied per second, counted once)."
                if memcpy else ""), "",
             "| message | seconds | algbw GB/s | busbw GB/s | busbw / memcpy |", "|---:|---:|---:|---:|---:|"]
    for row in section.get("sweep", []):
        ratio = f"{row['busbw_gbps'] / memcpy:.3f}" if memcpy else "-"
        lines.append(f"| {_size(row['bytes'])} | {row['seconds']:.6f} | {row['algbw_gbps']:.3f} "
                     f"| {row['busbw_gbps']:.3f} | {ratio} |")
    if section.get("packs"):
        lines += ["", "| communication | bytes_per_pack | packs | seconds | busbw GB/s | |",
                  "|---|---:|---:|---:|---:|---|"]
        for row in section["packs"]:
            lines.append(f"| {row['communication']} | {row['bytes_per_pack']} | {row['packs']} "
                         f"| {row['seconds']:.6f} | {row['busbw_gbps']:.3f} | {'fastest' if row['fastest'] else ''} |")
    return lines


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


def projection_table(*, compute_seconds: float, gradient_bytes: float, alpha: float, overlap: float = 0.0,
                     latency_allreduces: int = 0, workers: Sequence[int] = WORKERS,
                     links_gbit: Sequence[float] = LINKS_GBIT) -> list[dict[str, Any]]:
    """``project`` for every link rate and worker count (links outer, workers inner)."""
    return [project(compute_seconds=compute_seconds, gradient_bytes=gradient_bytes, workers=n, link_gbit=link,
                    alpha=alpha, overlap=overlap, latency_allreduces=latency_allreduces)
            for link in links_gbit for n in workers]


def projection_markdown(rows: Sequence[Mapping[str, Any]], *, compute_seconds: float, gradient_bytes: float,
                        alpha_source: str = "", overlap: float = 0.0) -> list[str]:
    """Report lines: the model and its assumptions, efficiency per workers x link, and the published results.

    ``rows`` are ``projection_table``'s; ``alpha_source`` says where alpha came from
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
