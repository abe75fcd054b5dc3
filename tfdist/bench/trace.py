"""The all-reduce share of a real training step, read from the trace TensorFlow's profiler writes."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

#: The trace event that ``profile`` puts around each step (``tf.profiler.experimental.Trace``).
STEP_EVENT = "tfdist_step"

#: The Keras optimizers' names (their name scope): the gradient all-reduce runs under one of them.
GRADIENT_SCOPES = ("sgd", "adam", "adam_w", "loss_scale_optimizer", "rmsprop", "adagrad", "lamb", "lion")

_BATCH_NORM = re.compile(r"_bn(_\d+)?$")
_SUFFIX = re.compile(r"_\d+$")


def profile(fn: Callable[[], Any], steps: int, logdir: str | Path, *, warmup: int = 1) -> dict[str, Any]:
    """Call ``fn()`` ``warmup`` times, then ``steps`` times under the profiler, writing its trace to ``logdir``.

    Each traced call is wrapped in a ``tfdist_step`` trace event and its
    result is fetched (``.numpy()``), so a step's event ends when the step
    has. Returns ``logdir``, ``steps`` and ``wall_seconds_per_step`` (the
    host's own clock, profiler overhead included). Give each worker of a
    cluster its own ``logdir``: the trace file is named after the host, so
    two workers on one machine would overwrite each other's.
    """
    import tensorflow as tf

    def call():
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())

    for _ in range(warmup):
        call()
    tf.profiler.experimental.start(str(logdir))
    try:
        start = time.perf_counter()
        for i in range(steps):
            with tf.profiler.experimental.Trace(STEP_EVENT, step_num=i, _r=1):
                call()
        wall = time.perf_counter() - start
    finally:
        tf.profiler.experimental.stop()
    return {"logdir": str(logdir), "steps": steps, "wall_seconds_per_step": wall / max(1, steps)}


def _xspace(logdir: str | Path):
    """The newest ``*.xplane.pb`` under ``logdir``, parsed."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files = sorted(Path(logdir).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"No *.xplane.pb under {logdir}: was the profiler started and stopped there?")
    space = xplane_pb2.XSpace()
    space.ParseFromString(files[-1].read_bytes())
    return space


def is_collective(op_type: str) -> bool:
    """Whether a TensorFlow op type is a cross-replica collective (all-reduce, gather, broadcast, NCCL)."""
    return op_type.startswith("Collective") or op_type.startswith("Nccl")


def kind(op_name: str, gradient_scopes: Sequence[str] = GRADIENT_SCOPES) -> str:
    """``"batch_norm"``, ``"gradient"`` or ``"unscoped"``: which all-reduce of the step an op's name is.

    ``batch_norm``: under a layer named ``*_bn`` (the UNet's ``ReplicaBatchNorm``);
    ``gradient``: under an optimizer's scope; ``unscoped``: anything else
    (batch norm's backward all-reduce and the step's stats reduction).
    """
    scopes = op_name.split("/")[:-1]
    if any(_BATCH_NORM.search(scope) for scope in scopes):
        return "batch_norm"
    if scopes and _SUFFIX.sub("", scopes[0]) in gradient_scopes:
        return "gradient"
    return "unscoped"


def _union_ps(intervals: Iterable[tuple[int, int]]) -> int:
    """The length of the union of ``[start, end)`` intervals (picoseconds): overlapping collectives count once."""
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def events(logdir: str | Path) -> tuple[list[tuple[int, int]], list[dict[str, Any]]]:
    """The host plane's step windows ``(start_ps, end_ps)`` and collective op events (``name``, ``type``, times)."""
    space = _xspace(logdir)
    hosts = [p for p in space.planes if p.name.startswith("/host:")] or list(space.planes)
    steps, collectives = [], []
    for plane in hosts:
        for line in plane.lines:
            origin = line.timestamp_ns * 1000
            for event in line.events:
                meta = plane.event_metadata[event.metadata_id]
                start = origin + event.offset_ps
                if meta.name == STEP_EVENT:
                    steps.append((start, start + event.duration_ps))
                    continue
                name, _, op_type = meta.name.rpartition(":")
                op_type = meta.display_name or op_type
                if name and "::" not in meta.name and is_collective(op_type):
                    collectives.append({"name": name, "type": op_type, "start_ps": start,
                                        "end_ps": start + event.duration_ps})
    return sorted(steps), collectives


def collective_share(logdir: str | Path, steps: int, *,
                     gradient_scopes: Sequence[str] = GRADIENT_SCOPES) -> dict[str, Any]:
    """How much of each traced step had a collective op in flight, from the trace ``profile`` wrote.

    Step windows are the ``tfdist_step`` events; a trace without them (not
    written by ``profile``) is taken as ``steps`` steps spanning its first to
    its last collective, which overstates the share.

    Args:
      logdir: the profiler's log directory.
      steps: the traced steps (used where the trace has no step events).
      gradient_scopes: name scopes of the gradient all-reduce (the optimizers' names).

    Returns:
      ``steps`` (counted), ``step_seconds`` (mean step time), ``collective_seconds_per_step``
      (time with at least one collective in flight, overlaps counted once), ``share`` (the two's
      ratio), ``count_per_step``, ``op_seconds_per_step`` (the events' summed durations),
      ``types`` (op types seen) and ``by_kind``: for ``batch_norm``, ``gradient`` and ``unscoped``
      (see ``kind``) its ``count_per_step``, ``seconds_per_step`` (union) and ``share``.
    """
    windows, collectives = events(logdir)
    if not windows:
        if not collectives:
            raise ValueError(f"The trace under {logdir} has neither {STEP_EVENT!r} events nor collective ops.")
        span = (min(c["start_ps"] for c in collectives), max(c["end_ps"] for c in collectives))
        windows = [span]
    else:
        steps = len(windows)
    step_ps = sum(hi - lo for lo, hi in windows)

    def inside(c):
        return any(lo <= c["start_ps"] < hi for lo, hi in windows)

    def clipped(group):
        out = []
        for c in group:
            for lo, hi in windows:
                if lo <= c["start_ps"] < hi:
                    out.append((c["start_ps"], min(c["end_ps"], hi)))
        return out

    traced = [c for c in collectives if inside(c)]
    busy_ps = _union_ps(clipped(traced))
    by_kind = {}
    for name in ("batch_norm", "gradient", "unscoped"):
        group = [c for c in traced if kind(c["name"], gradient_scopes) == name]
        group_ps = _union_ps(clipped(group))
        by_kind[name] = {"count_per_step": len(group) / steps, "seconds_per_step": group_ps / 1e12 / steps,
                         "share": group_ps / step_ps if step_ps else 0.0}
    return {
        "steps": steps,
        "step_seconds": step_ps / 1e12 / steps,
        "collective_seconds_per_step": busy_ps / 1e12 / steps,
        "share": busy_ps / step_ps if step_ps else 0.0,
        "count_per_step": len(traced) / steps,
        "op_seconds_per_step": sum(e - s for s, e in clipped(traced)) / 1e12 / steps,
        "types": sorted({c["type"] for c in traced}),
        "by_kind": by_kind,
    }


def unet_step(strategy, *, image_size: int = 32, base_filters: int = 4, depth: int = 2,
              global_batch_size: int = 8, optimizer: str = "sgd") -> Callable[[], Any]:
    """A real tfdist train step (``Steps.train`` on every replica, stats summed) of a UNet, over shapes data.

    Built as the training loop builds it: model and optimizer under
    ``strategy.scope()``, a distributed dataset, and one ``tf.function``
    around ``strategy.run``; returns a no-argument callable for ``profile``.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist.data import generate_shapes
    from tfdist.models import build_unet
    from tfdist.segmentation.steps import Steps

    with strategy.scope():
        model = build_unet(image_size=image_size, num_classes=4, base_filters=base_filters, depth=depth)
        opt = keras.optimizers.SGD(0.05) if optimizer == "sgd" else keras.optimizers.Adam(1e-3)
    steps = Steps(model=model, optimizer=opt, num_classes=4, global_batch_size=global_batch_size)
    images, masks = generate_shapes(global_batch_size * 4, image_size, 0)
    data = tf.data.Dataset.from_tensor_slices((images.astype(np.float32) / 255.0, masks.astype(np.int32)))
    iterator = iter(strategy.experimental_distribute_dataset(data.batch(global_batch_size).repeat()))

    @tf.function
    def step():
        per_replica = strategy.run(steps.train, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return step

