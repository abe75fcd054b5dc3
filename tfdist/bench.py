"""``python -m tfdist.bench``: tfdist's training throughput beside plain Keras, as ratios.

Every row trains the same UNet, global batch and shapes data (generated,
held in memory, no augmentation: the same images Keras gets):

- ``keras_fit``: the baseline, plain ``model.fit`` on one device, written as a
  user would write it (``compile("adam", ...)`` with Keras' defaults; on a
  CPU-only host Keras' ``jit_compile="auto"`` means no XLA, and tfdist's
  default is no XLA too);
- tfdist ``one_device``, ``mirrored`` x1/x2, ``central_storage`` x2,
  ``multi_worker_mirrored`` with 1 and 2 worker processes (gRPC on
  127.0.0.1), ``parameter_server`` with 1 and 2 workers (an in-process cluster
  of real gRPC servers), each with tfdist's defaults;
- the input pipeline against cached tensors (the same steps fed from
  ``take(n).cache().repeat()`` of already-built batches);
- the all-reduce time of the model's gradients under 2-worker
  ``multi_worker_mirrored`` and its share of a step;
- time from process start to the first finished step, and peak memory (RSS)
  of each row;
- scaling: time per epoch at 1x, 2x and 4x the dataset and at two image sizes.

Rows that need the same process set-up share one process (start-up is most
of a short row's time): the one-logical-CPU rows (``keras_fit``,
``one_device``, ``mirrored_1``, the input pipeline, scaling) and the
two-logical-CPU rows (``mirrored_2``, ``central_storage_2``); each runs its
rows one after another, ``--repeats`` times interleaved, so a slow moment of
the machine hits every row alike. Rows with a cluster (collectives, gRPC
servers) get fresh processes per run, since a cluster cannot be torn down.
A row's peak memory is the process's high-water mark reset at the row's start
(Linux ``clear_refs``); its time to first step is the process's start-up
(imports) plus the row's own build, trace and first step.

Throughput is images per second after warm-up: Keras within its second
epoch, after that epoch's first step (Keras' array adapter spends about 1 s
at each epoch boundary here, which the baseline leaves out: the strictest
baseline for tfdist), tfdist after its first loop call (which traces).
``--repeats N`` runs each row N times and reports the median. Output:
``--output FILE.json`` with ``{"baseline": {...}, "rows": [{"name",
"images_per_second", "ratio", ...}]}``, a Markdown table (``--markdown``,
default beside the JSON) and a PNG chart (``--chart``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import flags

from tfdist.errors import UserError, run_main

FLAGS = flags.FLAGS

#: The benchmark's experiment: the default UNet at the default size and batch.
BASE = {"image_size": 32, "train_examples": 256, "eval_examples": 32, "global_batch_size": 16,
        "base_filters": 16, "depth": 3, "log_every": 1000, "checkpoint_every": 100000, "eval_steps": 1,
        "deterministic": False, "augment": False, "export": False}


def define_flags() -> None:
    flags.DEFINE_bool("quick", False, "Fewer steps and one run of each row: about 4.5 minutes on 2 cores.")
    flags.DEFINE_integer("steps", 0, "Timed steps per row (0: 16 with --quick, else 64).")
    flags.DEFINE_integer("repeats", 0, "Runs of each row; the median is reported (0: 1 with --quick, else 3).")
    flags.DEFINE_string("output", "bench.json", "Where to write the JSON results.")
    flags.DEFINE_string("markdown", None, "Where to write the Markdown table (default: OUTPUT with .md).")
    flags.DEFINE_string("chart", None, "Where to write the PNG chart (default: OUTPUT with .png).")
    flags.DEFINE_list("only", [], "Run only these rows (names as in the table), e.g. keras_fit,one_device.")
    flags.DEFINE_bool("scaling", True, "Also measure time per epoch at 1x/2x/4x data and two image sizes.")
    flags.DEFINE_string("child", None, "Internal: run these measurements in this process (JSON).")


# --------------------------------------------------------------------------- children
# A child process runs a list of row specs and prints one line "BENCH {json}" per row.


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


def _measure_keras_fit(spec: dict) -> dict:
    """The baseline: plain Keras ``fit`` on in-memory tensors, one device."""
    import keras
    import numpy as np

    from tfdist.data import generate_shapes
    from tfdist.models import build_unet

    p = {**BASE, **spec["overrides"]}
    batch, steps = p["global_batch_size"], spec["steps"]
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
    return {"images_per_second": (len(timed) - 1) * batch / (timed[-1] - timed[0]), "first_step_at": first_step[0]}


def _tfdist_config(spec: dict, model_dir: str):
    from tfdist import config as config_lib

    p = {**BASE, **spec["overrides"]}
    return config_lib.build_config(overrides={
        **p, "strategy": spec["strategy"], "epochs": 1, "steps_per_epoch": spec["warmup"] + spec["steps"],
        "model_dir": model_dir,
    })


def _measure_tfdist(spec: dict, cluster_resolver=None) -> dict:
    """A tfdist run with its defaults; a multi_worker_mirrored task finds its cluster in TF_CONFIG."""
    from tfdist.training import run

    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as tmp:
        summary = run(_tfdist_config(spec, tmp), verbose=False, cluster_resolver=cluster_resolver)
    return {"images_per_second": summary["images_per_second"], "first_step_at": summary["first_step_at"],
            "num_replicas": summary["num_replicas"]}


def _measure_parameter_server(spec: dict) -> dict:
    """parameter_server over an in-process cluster of real gRPC servers (1 ps, N workers)."""
    from tfdist.local_cluster import in_process_cluster
    from tfdist.strategies import grpc_fail_fast_for_parameter_server, setup_host

    grpc_fail_fast_for_parameter_server()  # before the servers start
    setup_host(inter_op_threads=spec["workers"] + 2)
    return _measure_tfdist(spec, in_process_cluster(num_workers=spec["workers"], num_ps=1))


def _time_steps(step_fn, iterator, warmup: int, steps: int) -> float:
    """Seconds per step of ``step_fn(iterator)`` after ``warmup`` calls."""
    for _ in range(warmup):
        step_fn(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        step_fn(iterator)
    return (time.perf_counter() - start) / steps


def _measure_pipeline(spec: dict) -> dict:
    """tfdist's input pipeline against cached tensors, feeding the same one-device train step."""
    import tensorflow as tf

    from tfdist import data as data_lib
    from tfdist.models import build_from_config
    from tfdist.training.optimizers import make_optimizer
    from tfdist.training.step import Steps

    config = _tfdist_config({**spec, "strategy": "one_device"}, tempfile.gettempdir())
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
        _time_steps(step_fn, iterator, 0, spec["warmup"])
    # Short blocks, alternating, so that a slow moment of the machine hits both alike.
    blocks = 4
    seconds = {name: 0.0 for name in iterators}
    for _ in range(blocks):
        for name, iterator in iterators.items():
            seconds[name] += _time_steps(step_fn, iterator, 0, max(2, spec["steps"] // blocks))
    pipeline_ips, cached_ips = (batch * blocks / seconds[name] for name in ("pipeline", "cached"))
    return {"images_per_second": pipeline_ips, "cached_images_per_second": cached_ips,
            "ratio_to_cached": pipeline_ips / cached_ips, "first_step_at": first_step_at}


def _measure_allreduce(spec: dict) -> dict:
    """All-reduce of the model's gradient shapes under multi_worker_mirrored (TF_CONFIG from the parent)."""
    from tfdist.strategies import make_strategy, setup_host

    setup_host(inter_op_threads=4)
    strategy = make_strategy("multi_worker_mirrored", bytes_per_pack=spec.get("bytes_per_pack", 0))
    import tensorflow as tf

    from tfdist.models import build_from_config

    config = _tfdist_config({**spec, "strategy": "multi_worker_mirrored"}, tempfile.gettempdir())
    with strategy.scope():
        model = build_from_config(config.model, config.data)
    shapes = [v.shape for v in model.trainable_variables]
    grads = [tf.ones(s) for s in shapes]

    @tf.function
    def reduce_once(_):
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", grads))

    seconds = _time_steps(reduce_once, None, spec["warmup"], spec["steps"])
    size_mb = sum(int(tf.size(g)) for g in grads) * 4 / 1e6
    return {"allreduce_seconds": seconds, "gradient_mb": size_mb}


_MEASURES = {
    "keras_fit": _measure_keras_fit,
    "tfdist": _measure_tfdist,
    "parameter_server": _measure_parameter_server,
    "pipeline": _measure_pipeline,
    "allreduce": _measure_allreduce,
}


def _child(job: dict) -> None:
    """Run ``job["rows"]`` in order in this process; one ``BENCH`` line each."""
    import tensorflow  # noqa: F401  (start-up is measured up to here: the imports every row needs)

    startup = time.time() - job["spawned_at"]
    for spec in job["rows"]:
        _reset_peak_rss()
        start_rss = _proc_status_mb("VmRSS")
        row_start = time.time()
        result = _MEASURES[spec["kind"]](spec)
        first = result.pop("first_step_at", None)
        if first is not None:
            result["seconds_to_first_step"] = startup + first - row_start
        peak = _peak_rss_mb()
        # The growth is the row's own: earlier rows of the process leave ~25 MB each of TensorFlow caches.
        result.update(name=spec["name"], peak_rss_mb=peak, row_seconds=time.time() - row_start,
                      rss_growth_mb=None if start_rss is None else peak - start_rss)
        print("BENCH " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- parent


def _parse_child_output(stdout: str) -> list[dict]:
    results = [json.loads(line[len("BENCH "):]) for line in stdout.splitlines() if line.startswith("BENCH ")]
    if not results:
        raise RuntimeError("the benchmark child printed no result")
    return results


def _spawn(rows: list[dict], env: dict | None = None) -> subprocess.Popen:
    """Start a benchmark child on ``rows`` (``env``: a cluster task's TF_CONFIG, else none)."""
    child_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    if env is None:
        child_env.pop("TF_CONFIG", None)
    job = json.dumps({"rows": rows, "spawned_at": time.time()})
    return _start([sys.executable, "-m", "tfdist.bench", "--child", job], child_env)


def _start(argv: list[str], env: dict) -> subprocess.Popen:
    """Start ``argv`` with its stdout and stderr in temporary files (``proc.outputs``).

    Files, not pipes: a child that filled a pipe (64 KB) nobody was reading
    yet would block, and its cluster peers with it.
    """
    outputs = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
    proc = subprocess.Popen(argv, stdout=outputs[0], stderr=outputs[1], text=True, env=env)
    proc.outputs = outputs
    return proc


def _read(file) -> str:
    file.seek(0)
    return file.read()


def _collect(processes: list[subprocess.Popen], timeout: float = 900) -> list[list[dict]]:
    """Each process's results (bounded wait); on a failure or time-out kill all and raise."""
    deadline = time.time() + timeout
    try:
        # Until all are done, one has failed (its peers would wait for it) or the time is up.
        statuses = [p.poll() for p in processes]
        while None in statuses and not any(statuses):
            if time.time() > deadline:
                raise RuntimeError(f"benchmark children still running after {timeout:g} s")
            time.sleep(0.2)
            statuses = [p.poll() for p in processes]
        outputs = [tuple(_read(f) for f in proc.outputs) for proc in processes]
        for proc, (_, stderr) in zip(processes, outputs):
            if proc.returncode:
                raise RuntimeError(f"benchmark child failed ({proc.returncode}): {stderr.strip()[-1500:]}")
        return [_parse_child_output(stdout) for stdout, _ in outputs]
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            for f in proc.outputs:
                f.close()


def _launch(job: dict) -> list[dict]:
    """Run one job's rows in ``job["processes"]`` processes; the chief's results, peak memory the largest."""
    n = job.get("processes", 1)
    if n == 1:
        return _collect([_spawn(job["rows"])])[0]
    from tfdist import cluster as cluster_lib
    from tfdist.local_cluster import free_ports

    spec = cluster_lib.parse_cluster_spec({"worker": [f"127.0.0.1:{p}" for p in free_ports(n)]}, source="bench")
    per_process = _collect([_spawn(job["rows"], {"TF_CONFIG": cluster_lib.tf_config_json(spec, "worker", i)})
                            for i in range(n)])
    chief = [dict(r) for r in per_process[0]]
    for i, row in enumerate(chief):
        row["peak_rss_mb"] = max(results[i]["peak_rss_mb"] for results in per_process)
    return chief


def _median(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    merged = {k: statistics.median(r[k] for r in runs) for k in keys}
    if len(runs) > 1:
        merged["runs"] = [r.get("images_per_second") for r in runs]
    return merged


def rows_for(steps: int, warmup: int) -> list[dict]:
    """Every throughput row: its name, and ``group`` (rows that share a process) or ``processes``."""

    def tfdist(name, strategy, cpu_devices=1):
        return {"name": name, "kind": "tfdist", "strategy": strategy, "steps": steps, "warmup": warmup,
                "overrides": {"cpu_devices": cpu_devices}}

    def parameter_server(name, workers):
        # One chunk of closures (tfdist's default per wait) warms up, as it traces; the timed steps are whole chunks.
        from tfdist.config import PS_STEPS_PER_LOOP as chunk

        return {**tfdist(name, "parameter_server"), "kind": "parameter_server", "workers": workers,
                "warmup": chunk, "steps": chunk * max(1, -(-steps // chunk))}

    return [
        {"group": "cpu1", "spec": {"name": "keras_fit", "kind": "keras_fit", "steps": steps, "overrides": {}}},
        {"group": "cpu1", "spec": tfdist("one_device", "one_device")},
        {"group": "cpu1", "spec": tfdist("mirrored_1", "mirrored", 1)},
        {"group": "cpu2", "spec": tfdist("mirrored_2", "mirrored", 2)},
        {"group": "cpu2", "spec": tfdist("central_storage_2", "central_storage", 2)},
        {"processes": 1, "spec": tfdist("multi_worker_mirrored_1", "multi_worker_mirrored")},
        {"processes": 2, "spec": tfdist("multi_worker_mirrored_2", "multi_worker_mirrored")},
        {"processes": 1, "spec": parameter_server("parameter_server_1", 1)},
        {"processes": 1, "spec": parameter_server("parameter_server_2", 2)},
        {"group": "cpu1", "spec": {"name": "input_pipeline", "kind": "pipeline", "steps": steps, "warmup": warmup,
                                   "overrides": {}}},
    ]


def scaling_rows(steps_at_1x: int) -> list[dict]:
    """Time per epoch (one_device) at 1x/2x/4x the data at 32 px, and 1x/2x at 64 px."""
    rows = []
    for size, factors in ((32, (1, 2, 4)), (64, (1, 2))):
        for factor in factors:
            rows.append({"group": "cpu1", "once": True, "size": size, "factor": factor, "spec": {
                "name": f"epoch_{size}px_{factor}x", "kind": "tfdist", "strategy": "one_device",
                "steps": steps_at_1x * factor, "warmup": 0,
                "overrides": {"image_size": size, "train_examples": BASE["global_batch_size"] * steps_at_1x * factor}}})
    return rows


def _allreduce_row(steps: int, warmup: int) -> dict:
    return {"processes": 2, "spec": {"name": "allreduce_2_workers", "kind": "allreduce", "steps": steps,
                                     "warmup": warmup, "overrides": {}}}


def jobs_for(rows: list[dict], repeats: int) -> list[dict]:
    """The processes to launch: one per group (its rows ``repeats`` times, interleaved), else one per run.

    Rows marked ``once`` (scaling: a time per epoch, not a ratio) run once, after the group's repeats.
    """
    jobs, groups, once = [], {}, {}
    for row in rows:
        if "group" in row:
            if row["group"] not in groups:
                groups[row["group"]], once[row["group"]] = {"processes": 1, "rows": []}, []
                jobs.append(groups[row["group"]])
            target = once[row["group"]] if row.get("once") else groups[row["group"]]["rows"]
            target.append(row["spec"])
        else:
            jobs += [{"processes": row["processes"], "rows": [row["spec"]]} for _ in range(repeats)]
    for name, job in groups.items():
        job["rows"] = job["rows"] * repeats + once[name]
    return jobs


def run_benchmark(*, quick: bool, steps: int = 0, repeats: int = 0, only=(), scaling: bool = True,
                  log=print) -> dict:
    """Measure every row; returns the JSON-ready results (see the module docstring)."""
    steps = steps or (16 if quick else 64)
    repeats = repeats or (1 if quick else 3)
    warmup = 4
    known = rows_for(steps, warmup)
    names = [r["spec"]["name"] for r in known]
    if any(name not in names for name in only):
        raise UserError(f"Invalid value for `--only`. Received: {','.join(only)}. "
                        f"Expected names among: {', '.join(names)}.")
    rows = [r for r in known if not only or r["spec"]["name"] in only]
    if "keras_fit" not in {r["spec"]["name"] for r in rows}:
        rows.insert(0, known[0])  # every ratio needs the baseline
    extra = []
    if not only or "multi_worker_mirrored_2" in only:
        extra.append(_allreduce_row(steps, warmup))
    if scaling and not only:
        extra += scaling_rows(8 if quick else 16)
    runs: dict[str, list[dict]] = {}
    for job in jobs_for(rows + extra, repeats):
        log(f"bench: {', '.join(dict.fromkeys(r['name'] for r in job['rows']))} ...")
        for result in _launch(job):
            runs.setdefault(result["name"], []).append(result)
            if "images_per_second" in result:
                log(f"bench: {result['name']}: {result['images_per_second']:.1f} images/s "
                    f"({result['row_seconds']:.0f} s)")
    measured = {r["spec"]["name"]: _median(runs[r["spec"]["name"]]) for r in rows}
    baseline = measured["keras_fit"]
    out_rows = []
    for name, result in measured.items():
        ips = result.get("images_per_second")
        out_rows.append({"name": name, "images_per_second": ips,
                         "ratio": ips / baseline["images_per_second"] if ips else None,
                         **{k: v for k, v in result.items() if k != "images_per_second"}})
    results = {"baseline": {"name": "keras_fit", **baseline}, "rows": out_rows,
               "settings": {"quick": quick, "steps": steps, "warmup": warmup, "repeats": repeats, **BASE}}
    if "allreduce_2_workers" in runs:
        allreduce = _median(runs["allreduce_2_workers"])
        mwm = measured.get("multi_worker_mirrored_2")
        if mwm:
            step_seconds = BASE["global_batch_size"] / mwm["images_per_second"]
            allreduce["share_of_step"] = allreduce["allreduce_seconds"] / step_seconds
        results["allreduce"] = allreduce
    scaled = [row for row in extra if "factor" in row]
    if scaled:
        results["scaling"] = []
        for row in scaled:
            r = _median(runs[row["spec"]["name"]])
            epoch_seconds = row["spec"]["steps"] * BASE["global_batch_size"] / r["images_per_second"]
            results["scaling"].append({"name": row["spec"]["name"], "image_size": row["size"],
                                       "factor": row["factor"], "epoch_seconds": epoch_seconds,
                                       "peak_rss_mb": r["peak_rss_mb"], "rss_growth_mb": r.get("rss_growth_mb")})
    results["goals"] = goals(results)
    return results


def goals(results: dict) -> list[dict]:
    """The speed tfdist must reach (issue 7), read off the results."""
    by_name = {r["name"]: r for r in results["rows"]}

    def ratio(a, b):
        if a in by_name and b in by_name and by_name[a]["images_per_second"] and by_name[b]["images_per_second"]:
            return by_name[a]["images_per_second"] / by_name[b]["images_per_second"]
        return None

    pipeline = by_name.get("input_pipeline", {}).get("ratio_to_cached")
    share = results.get("allreduce", {}).get("share_of_step")
    checks = [
        ("one_device >= 1.00x keras_fit", ratio("one_device", "keras_fit"), lambda v: v >= 1.0),
        ("mirrored_1 >= 0.97x keras_fit", ratio("mirrored_1", "keras_fit"), lambda v: v >= 0.97),
        ("input pipeline >= 0.95x cached tensors", pipeline, lambda v: v >= 0.95),
        ("multi_worker_mirrored_2 all-reduce <= 15% of the step", share, lambda v: v <= 0.15),
        ("parameter_server_2 >= 1.5x parameter_server_1", ratio("parameter_server_2", "parameter_server_1"),
         lambda v: v >= 1.5),
    ]
    return [{"goal": g, "value": v, "met": None if v is None else bool(ok(v))} for g, v, ok in checks]


def markdown(results: dict) -> str:
    """The results as Markdown tables."""
    lines = ["| row | images/s | ratio to keras_fit | s to first step | peak RSS MB |", "|---|---:|---:|---:|---:|"]
    for r in results["rows"]:
        ips, ratio = r.get("images_per_second"), r.get("ratio")
        first = r.get("seconds_to_first_step")
        lines.append(f"| {r['name']} | {ips:.1f} | {ratio:.2f} | {'' if first is None else f'{first:.1f}'} | "
                     f"{r.get('peak_rss_mb', 0):.0f} |")
    if "allreduce" in results:
        a = results["allreduce"]
        share = a.get("share_of_step")
        lines += ["", f"All-reduce of {a['gradient_mb']:.1f} MB of gradients, 2 workers: "
                      f"{a['allreduce_seconds'] * 1000:.1f} ms"
                      + ("" if share is None else f", {share:.0%} of a multi_worker_mirrored_2 step") + "."]
    if results.get("scaling"):
        lines += ["", "| scaling | image size | data | epoch seconds | peak RSS MB | RSS growth in the row MB |",
                  "|---|---:|---:|---:|---:|---:|"]
        for s in results["scaling"]:
            growth = s.get("rss_growth_mb")
            lines.append(f"| {s['name']} | {s['image_size']} | {s['factor']}x | {s['epoch_seconds']:.1f} | "
                         f"{s['peak_rss_mb']:.0f} | {'' if growth is None else f'{growth:.0f}'} |")
    lines += ["", "| goal | value | met |", "|---|---:|---|"]
    for g in results["goals"]:
        value = "" if g["value"] is None else f"{g['value']:.3f}"
        lines.append(f"| {g['goal']} | {value} | {'' if g['met'] is None else ('yes' if g['met'] else 'no')} |")
    return "\n".join(lines) + "\n"


def chart(results: dict, path: str) -> None:
    """A bar chart of each row's ratio to the Keras baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r.get("ratio")]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    ax.barh([r["name"] for r in rows], [r["ratio"] for r in rows], color="#4c72b0")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("images/s relative to plain Keras fit (one device)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if FLAGS.child:
        _child(json.loads(FLAGS.child))
        return 0
    if len(argv) > 1:
        raise UserError(f"Unexpected arguments. Received: {' '.join(argv[1:])}. Expected only --flags.")
    output = Path(FLAGS.output)
    results = run_benchmark(quick=FLAGS.quick, steps=FLAGS.steps, repeats=FLAGS.repeats, only=FLAGS.only,
                            scaling=FLAGS.scaling, log=lambda m: print(m, flush=True))
    results["machine"] = {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0]}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    Path(FLAGS.markdown or output.with_suffix(".md")).write_text(table)
    chart(results, FLAGS.chart or str(output.with_suffix(".png")))
    print(table)
    return 0


def entry() -> None:
    """Console-script entry point (``tfdist-bench``)."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
