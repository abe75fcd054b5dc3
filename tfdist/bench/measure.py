"""What a benchmark child runs: each row's measurement over one timing window, its peak memory and its time
to first step, printed as one ``Measured`` line per row.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from tfdist.bench.rows import ChildJob, Measured, RowSpec
from tfdist.deploy.in_process import in_process_cluster
from tfdist.errors import UserError
from tfdist.segmentation.config import build_config
from tfdist.strategies import make_strategy, set_grpc_fail_fast, setup_host, traits

Measurement = Callable[[RowSpec], tuple[Measured, float | None]]


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux VmHWM; ``ru_maxrss`` elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0 / (1024.0 if sys.platform == "darwin" else 1.0)


def tick() -> tuple[float, float]:
    """Now on both clocks a window reads: ``(time.perf_counter(), time.process_time())``.

    The process's CPU time (all its threads) counts the work a step costs whatever else the machine runs; the
    wall clock counts what a user waits.
    """
    return time.perf_counter(), time.process_time()


def elapsed(start: tuple[float, float], end: tuple[float, float]) -> tuple[float, float]:
    """The wall and CPU seconds from one ``tick()`` to a later one."""
    return end[0] - start[0], end[1] - start[1]


def window(clock: list[tuple[int, float, float]], start_step: int, end_step: int) -> tuple[int, float, float]:
    """The steps, wall seconds and CPU seconds from the first step ended at or after ``start_step`` to the end of
    ``end_step``, on a ``(step, perf_counter, process_time)`` clock: a run whose chunks grow may end none at
    ``start_step`` itself."""
    at = {step: times for step, *times in clock}
    start = min((s for s in at if start_step <= s < end_step), default=None)
    if start is None or end_step not in at:
        raise RuntimeError(f"the benchmark's window needs a step ended in [{start_step}, {end_step}) and the end of "
                           f"step {end_step}; the run's chunks ended at {sorted(at)[:12]}...")
    return end_step - start, *elapsed(at[start], at[end_step])


def keras_experiment(spec: RowSpec):
    """The Keras rows' arrays and model: ``(x, y, model_fn)``, one epoch of ``warmup + steps`` global batches.

    The model is the row's ``model``: the UNet by default, else ``small_experiment``'s. Imports Keras but runs no
    TensorFlow op: the strategy is made after it.
    """
    p = spec.experiment()
    import keras
    import numpy as np

    from tfdist.data import generate_shapes
    from tfdist.models import build_unet

    rows = p["global_batch_size"] * (spec.warmup + spec.steps)
    if p.get("model", "unet") != "unet":
        return small_experiment(p["model"], rows, p["image_size"])
    images, masks = generate_shapes(rows, p["image_size"], 0)

    def model_fn():
        keras.mixed_precision.set_global_policy(p.get("precision", "float32"))
        model = build_unet(image_size=p["image_size"], num_classes=4, base_filters=p["base_filters"],
                           depth=p["depth"])
        model.compile(optimizer=keras.optimizers.Adam(2e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=p.get("jit_compile", "auto"))
        return model

    return images.astype(np.float32) / 255.0, masks.astype(np.int32), model_fn


def small_experiment(model: str, rows: int, image_size: int):
    """``(x, y, model_fn)`` of a small Keras model, whose steps cost little beside a loop's own per-step work.

    ``dense``: 32 features -> Dense(64, relu) -> Dense(4, softmax). ``conv``: the shapes' images -> three 3x3
    convolutions (32, 64, 128 filters, the first two pooled) -> global average -> Dense(4, softmax), classifying
    each image by its mask's most common class. Adam and a sparse cross-entropy both.
    """
    import keras
    import numpy as np

    from tfdist.data import generate_shapes

    if model == "dense":
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(rows, 32)).astype(np.float32), rng.integers(0, 4, size=rows).astype(np.int32)

        def layers():
            return [keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                    keras.layers.Dense(4, activation="softmax")]
    else:
        images, masks = generate_shapes(rows, image_size, 0)
        x = images.astype(np.float32) / 255.0
        counts = np.stack([(masks == c).sum(axis=(1, 2, 3)) for c in range(4)], axis=1)
        y = counts.argmax(axis=1).astype(np.int32)

        def layers():
            return [keras.Input((image_size, image_size, 3)),
                    keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
                    keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
                    keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
                    keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4, activation="softmax")]

    def model_fn():
        built = keras.Sequential(layers())
        built.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
        return built

    return x, y, model_fn


def _measure_keras_fit(spec: RowSpec) -> tuple[Measured, float]:
    """The baseline: plain Keras ``fit`` on in-memory arrays, one device or under ``spec.strategy``.

    Across worker processes (``multi_worker_mirrored``, TF_CONFIG from the parent) Keras' own ``fit`` runs
    after ``tfdist.patch_keras()``, with the strategy tfdist's rows get (its defaults; inter-op threads for the
    cluster, without which a cluster on few cores hangs); every worker holds the same arrays and Keras' ``fit``
    shards them.
    """
    import contextlib

    import tfdist

    p = spec.experiment()
    across_workers = bool(spec.strategy) and traits(spec.strategy).multi_process
    if p.get("setup"):
        strategy = tfdist.setup(spec.strategy, cpu_devices=p["cpu_devices"], verbose=False)
    elif across_workers:
        tfdist.patch_keras()
        setup_host(inter_op_threads=spec.workers + 1)
    else:
        setup_host(cpu_devices=p["cpu_devices"])
    import keras

    batch, total = p["global_batch_size"], spec.warmup + spec.steps
    x, y, model_fn = keras_experiment(spec)  # one epoch: no boundary in the window
    if not p.get("setup"):
        strategy = make_strategy(spec.strategy, cpu_devices=p["cpu_devices"]) if spec.strategy else None
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = model_fn()
    if spec.epochs > 1:  # timed as the tfdist_fit rows are: the last epoch whole, by epoch hooks alone
        seconds, cpu = _fit_last_epoch(spec, lambda callback: model.fit(
            x, y, batch_size=batch, epochs=spec.epochs, callbacks=[callback], verbose=0, shuffle=True))
        return Measured(name=spec.name, images_per_second=total * batch / seconds, cpu_seconds_per_step=cpu / total,
                        global_batch_size=batch, num_replicas=strategy.num_replicas_in_sync if strategy else 1), None
    clock: list[tuple[int, float, float]] = []
    first_step: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            clock.append((len(clock) + 1, *tick()))
            if len(clock) == 1:
                first_step.append(time.time())

    model.fit(x, y, batch_size=batch, epochs=1, callbacks=[Clock()], verbose=0, shuffle=True)
    steps, seconds, cpu = window(clock, spec.warmup, total)
    replicas = strategy.num_replicas_in_sync if strategy else 1
    return Measured(name=spec.name, images_per_second=steps * batch / seconds, cpu_seconds_per_step=cpu / steps,
                    global_batch_size=batch, num_replicas=replicas), first_step[0]


def _measure_tfdist_fit(spec: RowSpec) -> tuple[Measured, None]:
    """``tfdist.fit`` on the Keras rows' model and arrays: ``spec.epochs`` epochs of ``warmup + steps`` steps.

    The clock is a callback with epoch hooks only (the hooks every ``tfdist.fit`` calls), so the window is the
    whole last epoch: from its ``on_epoch_begin`` (right after the epoch before it ended) to its
    ``on_epoch_end``, its end-of-epoch work (the epoch's logs, its row of metrics.jsonl) included, which the
    Keras rows' window leaves out. The epochs before it, each Keras' whole run, are the warm-up. No time to
    first step: no epoch hook marks it.
    """
    import tfdist

    p = spec.experiment()
    batch, per_epoch = p["global_batch_size"], spec.warmup + spec.steps
    x, y, model_fn = keras_experiment(spec)
    replicas = []

    def fit(callback):
        history = tfdist.fit(model_fn, x, y, batch_size=batch, epochs=spec.epochs, steps_per_epoch=per_epoch,
                             strategy=spec.strategy, cpu_devices=p["cpu_devices"], shuffle=True, verbose=0,
                             callbacks=[callback])
        replicas.append(history.model.distribute_strategy.num_replicas_in_sync)

    seconds, cpu = _fit_last_epoch(spec, fit)
    return Measured(name=spec.name, images_per_second=per_epoch * batch / seconds,
                    cpu_seconds_per_step=cpu / per_epoch, global_batch_size=batch, num_replicas=replicas[0]), None


def _fit_last_epoch(spec: RowSpec, fit) -> tuple[float, float]:
    """Wall and CPU seconds of the last of ``spec.epochs`` epochs of ``fit(callback)``, from its
    ``on_epoch_begin`` to its ``on_epoch_end`` (a callback with epoch hooks alone, which asks for no batch's
    logs)."""
    import keras

    clock: dict[str, tuple[float, float]] = {}

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            clock[f"begin_{epoch}"] = tick()

        def on_epoch_end(self, epoch, logs=None):
            clock[f"end_{epoch}"] = tick()

    fit(Clock())
    last = spec.epochs - 1
    return elapsed(clock[f"begin_{last}"], clock[f"end_{last}"])


def _tfdist_config(spec: RowSpec, model_dir: str):
    """The row's tfdist experiment: ``spec.epochs`` epochs of its warm-up and timed steps."""
    return build_config(overrides={
        **spec.experiment(), "strategy": spec.strategy, "epochs": spec.epochs,
        "steps_per_epoch": spec.warmup + spec.steps, "model_dir": model_dir,
    })


def _measure_tfdist(spec: RowSpec, cluster_resolver=None, clock: list | None = None) -> tuple[Measured, float]:
    """A tfdist run with its defaults; a multi_worker_mirrored task finds its cluster in TF_CONFIG."""
    from tfdist.engine.plan import Clock
    from tfdist.segmentation import run

    clock = [] if clock is None else clock
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as tmp:
        summary = run(_tfdist_config(spec, tmp), verbose=False, cluster_resolver=cluster_resolver,
                      hooks=(Clock(clock),))
    batch = spec.experiment()["global_batch_size"]
    per_epoch = spec.warmup + spec.steps
    if spec.epochs > 1:  # a scaling row: the wall time of its last epoch, boundary and eval included
        measured = Measured(name=spec.name, epoch_seconds=window(clock, per_epoch * (spec.epochs - 1),
                                                                 per_epoch * spec.epochs)[1])
    else:
        steps, seconds, cpu = window(clock, spec.warmup, per_epoch)
        measured = Measured(name=spec.name, images_per_second=steps * batch / seconds,
                            cpu_seconds_per_step=cpu / steps, global_batch_size=batch)
    return dataclasses.replace(measured, num_replicas=summary["num_replicas"]), summary["first_step_at"]


def _measure_parameter_server(spec: RowSpec) -> tuple[Measured, float]:
    """parameter_server over an in-process cluster of real gRPC servers (1 ps, N workers)."""
    set_grpc_fail_fast()  # before the servers start
    setup_host(inter_op_threads=spec.workers + 2)
    return _measure_tfdist(spec, in_process_cluster(num_workers=spec.workers, num_ps=1))


def _time_steps(step_fn, iterator, steps: int) -> float:
    """Seconds per step of ``step_fn(iterator)``."""
    start = time.perf_counter()
    for _ in range(steps):
        step_fn(iterator)
    return (time.perf_counter() - start) / steps


def _measure_pipeline(spec: RowSpec) -> tuple[Measured, float]:
    """tfdist's input pipeline against cached tensors, feeding the same one-device train step."""
    import tensorflow as tf

    from tfdist import data as data_lib
    from tfdist.models import build_from_config
    from tfdist.segmentation.optimizers import make_optimizer
    from tfdist.segmentation.steps import Steps

    config = _tfdist_config(spec, tempfile.gettempdir())
    batch = config.train.global_batch_size
    model = build_from_config(config.model, config.data)
    steps = Steps(model=model, optimizer=make_optimizer(config.train, "float32", 1000), num_classes=4,
                  global_batch_size=batch)
    step_fn = tf.function(lambda it: steps.train(next(it)))
    pipeline = data_lib.make_dataset(config.data, "train", global_batch_size=batch, seed=0, training=True)
    iterators = {"pipeline": iter(pipeline), "cached": iter(pipeline.take(8).cache().repeat())}
    step_fn(iterators["pipeline"])
    first_step_at = time.time()
    for iterator in iterators.values():
        _time_steps(step_fn, iterator, spec.warmup)
    # Short blocks, alternating, so that a slow moment of the machine hits both alike.
    blocks = 4
    seconds = {name: 0.0 for name in iterators}
    for _ in range(blocks):
        for name, iterator in iterators.items():
            seconds[name] += _time_steps(step_fn, iterator, max(2, spec.steps // blocks))
    pipeline_ips, cached_ips = (batch * blocks / seconds[name] for name in ("pipeline", "cached"))
    measured = Measured(name=spec.name, images_per_second=pipeline_ips, cached_images_per_second=cached_ips,
                        ratio_to_cached=pipeline_ips / cached_ips, global_batch_size=batch, num_replicas=1)
    return measured, first_step_at


def _measure_comm(spec: RowSpec) -> tuple[Measured, None]:
    """The all-reduce sweep (64 KB to 64 MB) against memcpy (``comm``); with 2 workers, the packing options too."""
    import math

    from tfdist.bench import comm
    from tfdist.models import build_from_config

    setup_host(inter_op_threads=spec.workers + 2)
    strategy = make_strategy("multi_worker_mirrored")
    config = _tfdist_config(spec, tempfile.gettempdir())
    with strategy.scope():
        model = build_from_config(config.model, config.data)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    details = comm.measure(strategy, comm.DEFAULT_SIZES, gradient_shapes=shapes if spec.workers == 2 else None)
    details.update(workers=spec.workers, gradient_bytes=4 * sum(math.prod(s) for s in shapes))
    return Measured(name=spec.name, details=details), None


class _Profiled(list):
    """A controller clock that traces the steps after ``start`` up to ``end`` with ``tf.profiler``, step by step.

    Each traced step is one ``trace.STEP_EVENT`` event, from the end of the step before it to its own end, so
    ``trace.collective_share`` reads the real steps of the real loop.
    """

    def __init__(self, start: int, end: int, logdir: str):
        super().__init__()
        self.start, self.end, self.logdir = start, end, logdir
        self._step = None

    def append(self, item) -> None:
        import tensorflow as tf

        from tfdist.bench.trace import STEP_EVENT

        super().append(item)
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
        if item[0] == self.start:
            tf.profiler.experimental.start(self.logdir)
        if self.start <= item[0] < self.end:
            self._step = tf.profiler.experimental.Trace(STEP_EVENT)
            self._step.__enter__()
        elif item[0] == self.end:
            tf.profiler.experimental.stop()


def _measure_trace(spec: RowSpec) -> tuple[Measured, float]:
    """The real 2-worker multi_worker_mirrored step in the real loop, traced: the collectives' share (``trace``)."""
    from tfdist.bench import trace

    traced = dataclasses.replace(spec, kind="tfdist", steps=max(4, min(spec.steps, 8)),
                                 overrides={**spec.overrides, "global_batch_size": 16 * spec.workers})
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-trace-") as logdir:
        clock = _Profiled(traced.warmup, traced.warmup + traced.steps, logdir)
        measured, first = _measure_tfdist(traced, clock=clock)
        details = trace.collective_share(logdir, traced.steps)
    return dataclasses.replace(measured, name=spec.name, details=details), first


_MEASURES: dict[str, Measurement] = {
    "keras_fit": _measure_keras_fit,
    "tfdist_fit": _measure_tfdist_fit,
    "tfdist": _measure_tfdist,
    "parameter_server": _measure_parameter_server,
    "pipeline": _measure_pipeline,
    "comm": _measure_comm,
    "trace": _measure_trace,
}


def run_child(job_json: str) -> None:
    """Run a ``ChildJob``'s rows in order in this process; one ``Measured`` line on stdout each."""
    try:
        job = ChildJob.from_json(job_json)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"Invalid value for `--child` (internal: the benchmark's own rows). Received: "
                        f"{job_json[:60]!r} ({type(e).__name__}). Expected the JSON of a ChildJob.") from None
    for spec in job.rows:
        row_start = time.time()
        measured, first_step_at = _MEASURES[spec.kind](spec)
        measured = dataclasses.replace(
            measured, peak_rss_mb=peak_rss_mb(), processes=1, row_seconds=time.time() - row_start,
            seconds_to_first_step=None if first_step_at is None else first_step_at - job.spawned_at)
        print(measured.to_line(), flush=True)
