"""All-reduce against its limit, inside each worker of a ``multi_worker_mirrored`` cluster: message-size
sweeps, packing choices and this machine's memory copy, in nccl-tests' terms.
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
    of ``projection.fit_cost`` absorbs.

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
