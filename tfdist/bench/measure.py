"""What a benchmark child runs: each row's measurement, and the row's memory and time to first step.

A child (``python -m tfdist.bench --child JOB``) runs its rows in order and
prints one ``Measured`` line per row (``run_child``). The parent never imports
TensorFlow: the imports of TensorFlow, Keras, tfdist's models, data and training
stack are inside the measurements, so a child pays only for what its rows need.

Each measurement returns its numbers and the clock time (``time.time()``)
at which its first step ended, or ``None`` where it has no training step;
``run_child`` turns that time into ``seconds_to_first_step`` and adds the
row's peak memory and wall time.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from tfdist import config as config_lib
from tfdist.bench.rows import ChildJob, Measured, RowSpec
from tfdist.cluster.local import in_process_cluster
from tfdist.strategies import make_strategy, set_grpc_fail_fast, setup_host

Measurement = Callable[[RowSpec], tuple[Measured, float | None]]


def _reset_peak_rss() -> None:
    """Start a new high-water mark of this process's memory (Linux; elsewhere the process's peak stays)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _proc_status_mb(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _peak_rss_mb() -> float:
    """Peak resident memory since the last reset (VmHWM), or of the whole process where there is none."""
    peak = _proc_status_mb("VmHWM")
    if peak is not None:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0 / (1024.0 if sys.platform == "darwin" else 1.0)


def _measure_keras_fit(spec: RowSpec) -> tuple[Measured, float]:
    """The baseline: plain Keras ``fit`` on in-memory tensors, one device."""
    import keras
    import numpy as np

    from tfdist.data import generate_shapes
    from tfdist.models import build_unet

    p = spec.experiment()
    batch, steps = p["global_batch_size"], spec.steps
    # Timed: the second epoch after its first step, so no epoch boundary falls in the window (each
    # costs Keras' array adapter about 1 s here, which with a 16-step epoch would halve the baseline).
    per_epoch = steps + 1
    images, masks = generate_shapes(batch * per_epoch, p["image_size"], 0)
    x, y = images.astype(np.float32) / 255.0, masks.astype(np.int32)
    model = build_unet(image_size=p["image_size"], num_classes=4, base_filters=p["base_filters"], depth=p["depth"])
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times: list[float] = []
    first_step: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())
            if len(times) == 1:
                first_step.append(time.time())

    model.fit(x, y, batch_size=batch, epochs=2, callbacks=[Clock()], verbose=0, shuffle=True)
    timed = times[per_epoch:]  # from the end of the second epoch's first step: `steps` steps
    ips = (len(timed) - 1) * batch / (timed[-1] - timed[0])
    return Measured(name=spec.name, images_per_second=ips), first_step[0]


def _tfdist_config(spec: RowSpec, model_dir: str):
    """The row's tfdist experiment: one epoch of its warm-up and timed steps."""
    return config_lib.build_config(overrides={
        **spec.experiment(), "strategy": spec.strategy, "epochs": 1, "steps_per_epoch": spec.warmup + spec.steps,
        "model_dir": model_dir,
    })


def _measure_tfdist(spec: RowSpec, cluster_resolver=None) -> tuple[Measured, float]:
    """A tfdist run with its defaults; a multi_worker_mirrored task finds its cluster in TF_CONFIG."""
    from tfdist.training import run

    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as tmp:
        summary = run(_tfdist_config(spec, tmp), verbose=False, cluster_resolver=cluster_resolver)
    measured = Measured(name=spec.name, images_per_second=summary["images_per_second"],
                        num_replicas=summary["num_replicas"])
    return measured, summary["first_step_at"]


def _measure_parameter_server(spec: RowSpec) -> tuple[Measured, float]:
    """parameter_server over an in-process cluster of real gRPC servers (1 ps, N workers)."""
    set_grpc_fail_fast()  # before the servers start
    setup_host(inter_op_threads=spec.workers + 2)
    return _measure_tfdist(spec, in_process_cluster(num_workers=spec.workers, num_ps=1))


def _time_steps(step_fn, iterator, warmup: int, steps: int) -> float:
    """Seconds per step of ``step_fn(iterator)`` after ``warmup`` calls."""
    for _ in range(warmup):
        step_fn(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        step_fn(iterator)
    return (time.perf_counter() - start) / steps


def _measure_pipeline(spec: RowSpec) -> tuple[Measured, float]:
    """tfdist's input pipeline against cached tensors, feeding the same one-device train step."""
    import tensorflow as tf

    from tfdist import data as data_lib
    from tfdist.models import build_from_config
    from tfdist.training.optimizers import make_optimizer
    from tfdist.training.step import Steps

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
        _time_steps(step_fn, iterator, 0, spec.warmup)
    # Short blocks, alternating, so that a slow moment of the machine hits both alike.
    blocks = 4
    seconds = {name: 0.0 for name in iterators}
    for _ in range(blocks):
        for name, iterator in iterators.items():
            seconds[name] += _time_steps(step_fn, iterator, 0, max(2, spec.steps // blocks))
    pipeline_ips, cached_ips = (batch * blocks / seconds[name] for name in ("pipeline", "cached"))
    measured = Measured(name=spec.name, images_per_second=pipeline_ips, cached_images_per_second=cached_ips,
                        ratio_to_cached=pipeline_ips / cached_ips)
    return measured, first_step_at


def _measure_allreduce(spec: RowSpec) -> tuple[Measured, None]:
    """All-reduce of the model's gradient shapes under multi_worker_mirrored (TF_CONFIG from the parent)."""
    setup_host(inter_op_threads=4)
    strategy = make_strategy("multi_worker_mirrored", bytes_per_pack=spec.bytes_per_pack)
    import tensorflow as tf

    from tfdist.models import build_from_config

    config = _tfdist_config(spec, tempfile.gettempdir())
    with strategy.scope():
        model = build_from_config(config.model, config.data)
    shapes = [v.shape for v in model.trainable_variables]
    grads = [tf.ones(s) for s in shapes]

    @tf.function
    def reduce_once(_):
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", grads))

    seconds = _time_steps(reduce_once, None, spec.warmup, spec.steps)
    size_mb = sum(int(tf.size(g)) for g in grads) * 4 / 1e6
    return Measured(name=spec.name, allreduce_seconds=seconds, gradient_mb=size_mb), None


_MEASURES: dict[str, Measurement] = {
    "keras_fit": _measure_keras_fit,
    "tfdist": _measure_tfdist,
    "parameter_server": _measure_parameter_server,
    "pipeline": _measure_pipeline,
    "allreduce": _measure_allreduce,
}


def run_child(job_json: str) -> None:
    """Run a ``ChildJob``'s rows in order in this process; one ``Measured`` line on stdout each."""
    job = ChildJob.from_json(job_json)
    import tensorflow  # noqa: F401  (start-up is measured up to here: the imports every row needs)

    startup = time.time() - job.spawned_at
    for spec in job.rows:
        _reset_peak_rss()
        start_rss = _proc_status_mb("VmRSS")
        row_start = time.time()
        measured, first_step_at = _MEASURES[spec.kind](spec)
        to_first_step = None if first_step_at is None else startup + first_step_at - row_start
        peak = _peak_rss_mb()
        # The growth is the row's own: earlier rows of the process leave ~25 MB each of TensorFlow caches.
        measured = dataclasses.replace(measured, seconds_to_first_step=to_first_step, peak_rss_mb=peak,
                                       row_seconds=time.time() - row_start,
                                       rss_growth_mb=None if start_rss is None else peak - start_rss)
        print(measured.to_line(), flush=True)
