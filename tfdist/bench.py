"""``python -m tfdist.bench``: tfdist's training throughput beside plain Keras, as ratios.

Every row trains the same UNet, global batch and shapes data (generated,
cached in memory) and is measured in its own fresh process, so that logical
devices, collectives and clusters never leak from one row into the next:

- ``keras_fit``: the baseline, plain ``model.fit`` on one device, written as a
  user would write it (``compile("adam", ...)``, Keras' defaults, XLA
  included where Keras turns it on);
- tfdist ``one_device``, ``mirrored`` x1/x2, ``central_storage`` x2,
  ``multi_worker_mirrored`` with 1 and 2 worker processes (gRPC on
  127.0.0.1), ``parameter_server`` with 1 and 2 workers (an in-process cluster
  of real servers);
- the input pipeline against cached tensors (the same steps fed from
  ``take(n).cache().repeat()`` of already-built batches);
- the all-reduce time of the model's gradients under 2-worker
  ``multi_worker_mirrored`` and its share of a step;
- time from process start to the first finished step, and peak memory (RSS)
  of each process;
- scaling: time per epoch at 1x, 2x and 4x the dataset and at two image sizes.

Throughput is images per second after warm-up (the first chunk, which traces
and compiles, is not counted). ``--repeats N`` runs each row N times and
reports the median. Output: ``--output FILE.json`` with ``{"baseline": {...},
"rows": [{"name", "images_per_second", "ratio", ...}]}``, a Markdown table
(``--markdown``, default beside the JSON) and a PNG chart (``--chart``).
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
BASE = {"image_size": 32, "train_examples": 512, "eval_examples": 32, "global_batch_size": 16,
        "base_filters": 16, "depth": 3, "log_every": 1000, "checkpoint_every": 100000, "eval_steps": 1,
        "deterministic": False}


def define_flags() -> None:
    flags.DEFINE_bool("quick", False, "Fewer steps and rows' repeats: about 3 minutes on 2 cores.")
    flags.DEFINE_integer("steps", 0, "Timed steps per row (0: 24 with --quick, else 60).")
    flags.DEFINE_integer("repeats", 0, "Runs of each row; the median is reported (0: 1 with --quick, else 3).")
    flags.DEFINE_string("output", "bench.json", "Where to write the JSON results.")
    flags.DEFINE_string("markdown", None, "Where to write the Markdown table (default: OUTPUT with .md).")
    flags.DEFINE_string("chart", None, "Where to write the PNG chart (default: OUTPUT with .png).")
    flags.DEFINE_list("only", [], "Run only these rows (names as in the table), e.g. keras_fit,one_device.")
    flags.DEFINE_bool("scaling", True, "Also measure time per epoch at 1x/2x/4x data and two image sizes.")
    flags.DEFINE_string("child", None, "Internal: run one measurement in this process (JSON spec).")


# --------------------------------------------------------------------------- children
# Each child runs in its own process and prints one line "BENCH {json}".


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _report(result: dict) -> None:
    result["peak_rss_mb"] = _peak_rss_mb()
    print("BENCH " + json.dumps(result), flush=True)


def _child_keras_fit(spec: dict) -> None:
    """The baseline: plain Keras ``fit`` on in-memory tensors, one device."""
    import keras
    import numpy as np

    from tfdist.data import generate_shapes
    from tfdist.models import build_unet

    p = {**BASE, **spec["overrides"]}
    images, masks = generate_shapes(p["train_examples"], p["image_size"], 0)
    x, y = images.astype(np.float32) / 255.0, masks.astype(np.int32)
    model = build_unet(image_size=p["image_size"], num_classes=4, base_filters=p["base_filters"], depth=p["depth"])
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times: list[float] = []
    first_step: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())
            if not first_step:
                first_step.append(time.time())

    batch, warmup, steps = p["global_batch_size"], spec["warmup"], spec["steps"]
    per_epoch = p["train_examples"] // batch
    epochs = -(-(warmup + steps) // per_epoch)
    model.fit(x, y, batch_size=batch, epochs=epochs, steps_per_epoch=per_epoch, callbacks=[Clock()], verbose=0,
              shuffle=True)
    timed = times[warmup: warmup + steps]
    _report({"images_per_second": (len(timed) - 1) * batch / (timed[-1] - timed[0]), "first_step_at": first_step[0]})


def _tfdist_config(spec: dict, model_dir: str):
    from tfdist import config as config_lib

    p = {**BASE, **spec["overrides"]}
    steps = spec["warmup"] + spec["steps"]
    return config_lib.build_config(overrides={
        **p, "strategy": spec["strategy"], "epochs": 1, "steps_per_epoch": steps,
        "steps_per_loop": spec.get("steps_per_loop", 1), "model_dir": model_dir,
    })


def _child_tfdist(spec: dict) -> None:
    """A tfdist run; a multi_worker_mirrored task finds its cluster in TF_CONFIG."""
    from tfdist.training import run

    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as tmp:
        model_dir = spec.get("model_dir") or tmp
        summary = run(_tfdist_config(spec, model_dir), verbose=False)
    _report({"images_per_second": summary["images_per_second"], "first_step_at": summary["first_step_at"],
             "wall_seconds": summary["wall_seconds"], "num_replicas": summary["num_replicas"]})


def _child_parameter_server(spec: dict) -> None:
    """parameter_server over an in-process cluster of real gRPC servers (1 ps, N workers)."""
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    from tfdist.local_cluster import in_process_cluster
    from tfdist.strategies import setup_host
    from tfdist.training import run

    workers = spec["workers"]
    setup_host(inter_op_threads=workers + 2)
    resolver = in_process_cluster(num_workers=workers, num_ps=1)
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as tmp:
        summary = run(_tfdist_config(spec, tmp), verbose=False, cluster_resolver=resolver)
    _report({"images_per_second": summary["images_per_second"], "first_step_at": summary["first_step_at"]})


def _time_steps(step_fn, iterator, warmup: int, steps: int) -> float:
    """Seconds per step of ``step_fn(iterator)`` after ``warmup`` calls."""
    for _ in range(warmup):
        step_fn(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        step_fn(iterator)
    return (time.perf_counter() - start) / steps


def _child_pipeline(spec: dict) -> None:
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
    cached = pipeline.take(8).cache().repeat()
    results = {}
    for name, ds in (("pipeline", pipeline), ("cached", cached)):
        seconds = _time_steps(step_fn, iter(ds), spec["warmup"], spec["steps"])
        results[name] = batch / seconds
    _report({"images_per_second": results["pipeline"], "cached_images_per_second": results["cached"],
             "ratio_to_cached": results["pipeline"] / results["cached"]})


def _child_allreduce(spec: dict) -> None:
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
    _report({"allreduce_seconds": seconds, "gradient_mb": size_mb})


_CHILDREN = {
    "keras_fit": _child_keras_fit,
    "tfdist": _child_tfdist,
    "parameter_server": _child_parameter_server,
    "pipeline": _child_pipeline,
    "allreduce": _child_allreduce,
}


# --------------------------------------------------------------------------- parent


def _parse_child_output(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("BENCH "):
            return json.loads(line[len("BENCH "):])
    raise RuntimeError("the benchmark child printed no result")


def _spawn(spec: dict, env: dict | None = None) -> subprocess.Popen:
    child_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    if env is None:
        child_env.pop("TF_CONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "tfdist.bench", "--child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)


def _collect(processes: list[subprocess.Popen], started: float, timeout: float = 600) -> list[dict]:
    """Wait for every process (bounded); on a failure or time-out kill all and raise."""
    results = []
    try:
        for proc in processes:
            stdout, stderr = proc.communicate(timeout=max(1.0, started + timeout - time.time()))
            if proc.returncode != 0:
                raise RuntimeError(f"benchmark child failed ({proc.returncode}): {stderr.strip()[-1500:]}")
            result = _parse_child_output(stdout)
            if result.get("first_step_at"):
                result["seconds_to_first_step"] = result.pop("first_step_at") - started
            results.append(result)
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return results


def _measure_once(row: dict) -> dict:
    """Run one row's processes and return the chief's result (peak memory: the largest process)."""
    started = time.time()
    if row.get("processes", 1) == 1:
        return _collect([_spawn(row["spec"])], started)[0]
    from tfdist import cluster as cluster_lib
    from tfdist.local_cluster import free_ports

    n = row["processes"]
    spec = cluster_lib.parse_cluster_spec({"worker": [f"127.0.0.1:{p}" for p in free_ports(n)]}, source="bench")
    processes = [_spawn(row["spec"], {"TF_CONFIG": cluster_lib.tf_config_json(spec, "worker", i)}) for i in range(n)]
    results = _collect(processes, started)
    chief = dict(results[0])
    chief["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
    return chief


def _median_of(row: dict, repeats: int) -> dict:
    runs = [_measure_once(row) for _ in range(repeats)]
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    merged = {k: statistics.median(r[k] for r in runs) for k in keys}
    if repeats > 1:
        merged["runs"] = [r.get("images_per_second") for r in runs]
    return merged


def rows_for(steps: int, warmup: int) -> list[dict]:
    """Every throughput row: name, strategy, processes, and the child's spec."""

    def tfdist(strategy, cpu_devices=1, **extra):
        return {"kind": "tfdist", "strategy": strategy, "steps": steps, "warmup": warmup,
                "overrides": {"cpu_devices": cpu_devices}, **extra}

    return [
        {"name": "keras_fit", "spec": {"kind": "keras_fit", "steps": steps, "warmup": warmup, "overrides": {}}},
        {"name": "one_device", "spec": tfdist("one_device")},
        {"name": "mirrored_1", "spec": tfdist("mirrored", 1)},
        {"name": "mirrored_2", "spec": tfdist("mirrored", 2)},
        {"name": "central_storage_2", "spec": tfdist("central_storage", 2)},
        {"name": "multi_worker_mirrored_1", "spec": tfdist("multi_worker_mirrored"), "processes": 1},
        {"name": "multi_worker_mirrored_2", "spec": tfdist("multi_worker_mirrored"), "processes": 2},
        {"name": "parameter_server_1", "spec": {**tfdist("parameter_server"), "kind": "parameter_server", "workers": 1}},
        {"name": "parameter_server_2", "spec": {**tfdist("parameter_server"), "kind": "parameter_server", "workers": 2}},
        {"name": "input_pipeline", "spec": {"kind": "pipeline", "steps": steps, "warmup": warmup, "overrides": {}}},
    ]


def scaling_rows(steps_at_1x: int) -> list[dict]:
    """Time per epoch (one_device) at 1x/2x/4x the data at 32 px, and 1x/2x at 64 px."""
    rows = []
    for size, factors in ((32, (1, 2, 4)), (64, (1, 2))):
        for factor in factors:
            examples = 16 * steps_at_1x * factor
            rows.append({"name": f"epoch_{size}px_{factor}x", "size": size, "factor": factor, "spec": {
                "kind": "tfdist", "strategy": "one_device", "steps": steps_at_1x * factor, "warmup": 0,
                "overrides": {"image_size": size, "train_examples": examples}}})
    return rows


def _allreduce_row(steps: int, warmup: int) -> dict:
    return {"name": "allreduce_2_workers", "processes": 2,
            "spec": {"kind": "allreduce", "steps": steps, "warmup": warmup, "overrides": {}}}


def run_benchmark(*, quick: bool, steps: int = 0, repeats: int = 0, only=(), scaling: bool = True,
                  log=print) -> dict:
    """Measure every row; returns the JSON-ready results (see the module docstring)."""
    steps = steps or (24 if quick else 60)
    repeats = repeats or (1 if quick else 3)
    warmup = 4
    rows = [r for r in rows_for(steps, warmup) if not only or r["name"] in only]
    if not rows:
        raise UserError(f"Invalid value for `--only`. Received: {','.join(only)}. "
                        f"Expected names among: {', '.join(r['name'] for r in rows_for(1, 1))}.")
    measured = {}
    for row in rows:
        log(f"bench: {row['name']} ...")
        measured[row["name"]] = _median_of(row, repeats)
        log(f"bench: {row['name']}: {measured[row['name']].get('images_per_second', 0):.1f} images/s")
    baseline = measured.get("keras_fit") or _median_of(rows_for(steps, warmup)[0], repeats)
    out_rows = []
    for name, result in measured.items():
        ips = result.get("images_per_second")
        out_rows.append({"name": name, "images_per_second": ips,
                         "ratio": ips / baseline["images_per_second"] if ips else None,
                         **{k: v for k, v in result.items() if k != "images_per_second"}})
    results = {"baseline": {"name": "keras_fit", **baseline}, "rows": out_rows,
               "settings": {"quick": quick, "steps": steps, "warmup": warmup, "repeats": repeats, **BASE}}
    if not only or "allreduce_2_workers" in only or "multi_worker_mirrored_2" in only:
        log("bench: allreduce_2_workers ...")
        allreduce = _median_of(_allreduce_row(steps, warmup), repeats)
        mwm = measured.get("multi_worker_mirrored_2")
        if mwm:
            step_seconds = BASE["global_batch_size"] / mwm["images_per_second"]
            allreduce["share_of_step"] = allreduce["allreduce_seconds"] / step_seconds
        results["allreduce"] = allreduce
    if scaling and not only:
        results["scaling"] = []
        for row in scaling_rows(steps // 2 if quick else steps):
            log(f"bench: {row['name']} ...")
            r = _median_of(row, 1)
            epoch_seconds = row["spec"]["steps"] * BASE["global_batch_size"] / r["images_per_second"]
            results["scaling"].append({"name": row["name"], "image_size": row["size"], "factor": row["factor"],
                                       "epoch_seconds": epoch_seconds, "peak_rss_mb": r["peak_rss_mb"]})
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
        lines += ["", "| scaling | image size | data | epoch seconds | peak RSS MB |", "|---|---:|---:|---:|---:|"]
        for s in results["scaling"]:
            lines.append(f"| {s['name']} | {s['image_size']} | {s['factor']}x | {s['epoch_seconds']:.1f} | "
                         f"{s['peak_rss_mb']:.0f} |")
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
        spec = json.loads(FLAGS.child)
        _CHILDREN[spec["kind"]](spec)
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
