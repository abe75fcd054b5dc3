"""The benchmark's results: ratios paired repeat by repeat, one repeat's record per row, scaling and goals; and
the same results as Markdown tables, a PNG chart and the generated blocks of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

import tfdist.bench.accuracy as accuracy_lib
import tfdist.bench.preemption as preemption_lib
from tfdist.bench.plan import BASELINE, WORKERS, Plan
from tfdist.bench.rows import Measured
from tfdist.errors import short

def spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "runs"}`` of ``values`` (one per repeat)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def speed(run: Measured, clock: str) -> float | None:
    """A run's images per second on ``clock``: ``"wall"``, or ``"cpu"`` (per second of its processes' CPU time)."""
    if clock == "wall":
        return run.images_per_second
    return run.global_batch_size / run.cpu_seconds_per_step if run.cpu_seconds_per_step and run.global_batch_size \
        else None


def paired(runs: Sequence[Measured], baseline: Sequence[Measured], clock: str = "wall") -> dict[str, Any] | None:
    """Each repeat's ``runs`` speed on ``clock`` over ``baseline``'s in the same repeat, as a ``spread``; None: no
    pair."""
    by_repeat = {m.repeat: speed(m, clock) for m in baseline}
    speeds = [(m.repeat, speed(m, clock)) for m in runs]
    ratios = [value / by_repeat[repeat] for repeat, value in speeds if value and by_repeat.get(repeat)]
    return spread(ratios) if ratios else None


def ratios(runs: Sequence[Measured], baseline: Sequence[Measured]) -> dict[str, Any] | None:
    """The wall clock's paired ``spread``, with the CPU time's as ``"cpu"`` where both sides measured it."""
    wall, cpu = paired(runs, baseline), paired(runs, baseline, "cpu")
    return None if wall is None else {**wall, "cpu": cpu} if cpu else wall


def median_record(runs: Sequence[Measured], keys: Sequence[float]) -> Measured:
    """The run whose key is the median one (the lower of the two middle ones for an even count)."""
    order = sorted(range(len(runs)), key=lambda i: keys[i])
    return runs[order[(len(runs) - 1) // 2]]


def _row(spec, runs: list[Measured], measured: Mapping[str, list[Measured]]) -> dict[str, Any]:
    """One row of the JSON: its paired ratios, its images/s spread, and its median repeat's record."""
    ratio = ratios(runs, measured[BASELINE]) if spec.name != BASELINE else None
    keys = ratio["runs"] if ratio and len(ratio["runs"]) == len(runs) else [m.images_per_second or 0 for m in runs]
    record = median_record(runs, keys)
    row = {"name": spec.name, "kind": spec.kind, "strategy": spec.strategy, "workers": spec.workers,
           "images_per_second": spread([m.images_per_second for m in runs]) if record.images_per_second else None,
           "ratio": ratio}
    if spec.baseline and spec.baseline in measured:
        row["ratio_to_baseline"] = {"to": spec.baseline, **(ratios(runs, measured[spec.baseline]) or {})}
    if spec.keras_baseline and spec.keras_baseline in measured:
        row["ratio_to_keras"] = {"to": spec.keras_baseline, **(ratios(runs, measured[spec.keras_baseline]) or {})}
    rec = record.to_dict()
    if record.peak_rss_mb and record.num_replicas:
        rec["peak_rss_mb_per_replica"] = record.peak_rss_mb / record.num_replicas
    row["record"] = rec
    return row


def _workers(rows: Mapping[str, dict]) -> dict[str, list[dict]]:
    """Throughput against 1 worker, per strategy: speedup (paired, median) and efficiency (speedup / workers)."""
    out = {}
    for family in ("multi_worker_mirrored", "parameter_server"):
        lines = []
        for n in WORKERS:
            row = rows.get(f"{family}_{n}")
            if row is None:
                continue
            speedup = 1.0 if n == 1 else (row.get("ratio_to_baseline") or {}).get("median")
            lines.append({"workers": n, "images_per_second": row["images_per_second"]["median"],
                          "speedup": speedup, "efficiency": None if speedup is None else speedup / n,
                          "speedup_spread": None if n == 1 else row.get("ratio_to_baseline")})
        if lines:
            out[family] = lines
    return out


def _allreduce(measured: Mapping[str, list[Measured]], rows: Mapping[str, dict]) -> dict[str, Any]:
    """The all-reduce sweeps, the packing options, the share in the real step, and the on-paper projection."""
    out: dict[str, Any] = {}
    for name in ("allreduce_2", "allreduce_4"):
        if name in measured:
            out[name] = dict(measured[name][0].details)
    if "traced_step_2" in measured:
        out["traced_step_2"] = dict(measured["traced_step_2"][0].details)
    one, two = rows.get("one_device"), out.get("allreduce_2")
    if two and one and one["images_per_second"]:
        from tfdist.bench import comm

        traced = out.get("traced_step_2", {}).get("by_kind", {})
        small = round(sum(traced.get(k, {}).get("count_per_step", 0) for k in ("batch_norm", "unscoped")))
        compute = one["record"]["global_batch_size"] / one["images_per_second"]["median"]
        common = {"compute_seconds": compute, "gradient_bytes": two["gradient_bytes"], "latency_allreduces": small}
        fitted = comm.fit_cost(two["sweep"])
        out["projection"] = {**common, "fit": fitted, "tables": {
            "datacenter_alpha": comm.projection_table(alpha=comm.DATACENTER_ALPHA_SECONDS, **common),
            "measured_alpha": comm.projection_table(alpha=fitted["alpha_seconds"], **common)}}
    return out


def results(plan: Plan, runs: Mapping[str, list[Measured]], settings: Mapping[str, Any], *,
            accuracy: Mapping[str, Any] | None = None, preemption: Mapping[str, Any] | None = None) -> dict:
    """The JSON-ready results of ``plan``'s rows from their ``runs`` (by row name), goals included."""
    throughput = [row.spec for row in plan.rows if row.spec.kind not in ("comm", "trace")]
    rows = {spec.name: _row(spec, runs[spec.name], runs) for spec in throughput}
    out: dict[str, Any] = {"settings": dict(settings), "baseline": BASELINE, "rows": list(rows.values())}
    workers = _workers(rows)
    if workers:
        out["workers"] = workers
    allreduce = _allreduce(runs, rows)
    if allreduce:
        out["allreduce"] = allreduce
    if plan.scaling:
        out["scaling"] = [{"name": row.spec.name, "image_size": row.image_size, "factor": row.factor,
                           "steps": row.spec.steps, "epoch_seconds": runs[row.spec.name][0].epoch_seconds}
                          for row in plan.scaling]
    if accuracy is not None:
        out["accuracy"] = dict(accuracy)
    if preemption is not None:
        out["preemption"] = dict(preemption)
    out["goals"] = goals(out)
    return out


def goals(results: Mapping[str, Any]) -> list[dict]:
    """The speed tfdist must reach, read off the results: each a paired median, with its spread where it has one."""
    rows = {r["name"]: r for r in results["rows"]}

    def ratio(name: str, to: str) -> dict | None:
        row = rows.get(name)
        if row is None:
            return None
        if to == BASELINE:
            return row["ratio"]
        return next((r for r in (row.get("ratio_to_baseline"), row.get("ratio_to_keras")) if r and r["to"] == to),
                    None)

    pipeline = rows.get("input_pipeline", {}).get("record", {}).get("ratio_to_cached")
    share = results.get("allreduce", {}).get("traced_step_2", {}).get("share")
    checks = [
        ("one_device >= 1.00x keras_fit", ratio("one_device", BASELINE), 1.0),
        ("tfdist_fit >= 0.97x keras_fit", ratio("tfdist_fit", BASELINE), 0.97),
        ("mirrored_1 >= 0.97x keras_fit", ratio("mirrored_1", BASELINE), 0.97),
        ("mirrored_2 >= 1.00x keras_fit_mirrored_2", ratio("mirrored_2", "keras_fit_mirrored_2"), 1.0),
        ("central_storage_2 >= 1.00x keras_fit_central_storage_2",
         ratio("central_storage_2", "keras_fit_central_storage_2"), 1.0),
        ("input pipeline >= 0.95x cached tensors", None if pipeline is None else {"median": pipeline}, 0.95),
        ("parameter_server_2 >= 1.5x parameter_server_1", ratio("parameter_server_2", "parameter_server_1"), 1.5),
        ("tfdist_fit_dense >= 0.95x keras_fit_dense", ratio("tfdist_fit_dense", "keras_fit_dense"), 0.95),
        ("tfdist_fit_conv >= 0.95x keras_fit_conv", ratio("tfdist_fit_conv", "keras_fit_conv"), 0.95),
        # tfdist.fit under mirrored, and Keras' fit under the strategy tfdist.setup returns, against Keras' own
        # MirroredStrategy on the same 2 CPUs: the UNet, and the small models.
        *((f"{row}{model} >= 1.00x keras_fit_mirrored_2{model}",
           ratio(f"{row}{model}", f"keras_fit_mirrored_2{model}"), 1.0)
          for model in ("", "_dense", "_conv") for row in ("tfdist_fit_mirrored_2", "keras_fit_setup_mirrored_2")),
    ]
    out = []
    for goal, value, at_least in checks:
        median = None if not value or value.get("median") is None else value["median"]
        cpu = (value or {}).get("cpu")
        out.append({"goal": goal, "value": median, "min": (value or {}).get("min"), "max": (value or {}).get("max"),
                    "met": None if median is None else median >= at_least,
                    "cpu": None if not cpu else {k: cpu[k] for k in ("median", "min", "max")}})
    out.append({"goal": "multi_worker_mirrored_2 collectives <= 15% of the real step", "value": share,
                "min": None, "max": None, "met": None if share is None else share <= 0.15, "cpu": None})
    return out


#: A generated block of a Markdown page: the JSON it is made from, its content, its end.
BLOCK = re.compile(r"(<!-- bench: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /bench -->)", re.S)


def _f(value, fmt: str = ".2f") -> str:
    return "" if value is None else format(value, fmt)


def _ratio(r: Mapping | None) -> str:
    """``median (min-max)`` of a paired ratio."""
    if not r or r.get("median") is None:
        return ""
    if r["min"] == r["max"]:
        return f"{r['median']:.2f}"
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def _to(r: Mapping) -> str:
    """A ratio to a row named in it, with its CPU time's where measured: ``0.98 (CPU time 1.01) to keras_fit``."""
    cpu = f" (CPU time {_ratio(r['cpu'])})" if r.get("cpu") else ""
    return f"{_ratio(r)}{cpu} to {r['to']}"


def header(results: Mapping[str, Any]) -> list[str]:
    """Where and how the results were measured: machine, versions, settings."""
    m, v, s = results.get("machine", {}), results.get("versions", {}), results.get("settings", {})
    return [f"Measured {m.get('date', '?')} on {m.get('cpu_model', '?')} ({m.get('cpus', '?')} CPUs, "
            f"{_f(m.get('memory_gb'), '.0f')} GB, {m.get('gpus', 'no')} GPU); Python {v.get('python', '?')}, "
            f"TensorFlow {v.get('tensorflow', '?')}, Keras {v.get('keras', '?')}, tfdist {v.get('tfdist', '?')}. "
            f"{s.get('repeats', '?')} repeat(s), {s.get('warmup', '?')} warm-up steps then {s.get('steps', '?')} "
            f"timed steps on every side; {_f(m.get('wall_seconds'), '.0f')} s in all."]


def _on_cpu(results: Mapping[str, Any]) -> bool:
    """Whether the rows measured their CPU time (results written before they did have no such column)."""
    return any(r["record"].get("cpu_seconds_per_step") for r in results["rows"])


def rows_table(results: Mapping[str, Any]) -> list[str]:
    on_cpu = _on_cpu(results)
    lines = ["| row | images/s (median of repeats) | ratio to keras_fit (paired: median, min-max) | "
             + ("on CPU time | " if on_cpu else "") + "ratio to its own baseline | s to first step | "
             "peak RSS MB (all processes) | MB per replica |",
             "|---|---:|---:|" + ("---:|" if on_cpu else "") + "---|---:|---:|---:|"]
    for r in results["rows"]:
        ips, rec = r.get("images_per_second") or {}, r["record"]
        own = "; ".join(_to(o) for o in (r.get("ratio_to_baseline"), r.get("ratio_to_keras")) if o)
        if not on_cpu:
            cpu = ""
        elif r["ratio"]:
            cpu = f"{_ratio(r['ratio'].get('cpu'))} | "
        else:  # the baseline itself
            cpu = "1.00 | " if rec.get("cpu_seconds_per_step") else " | "
        lines.append(f"| {r['name']} | {_f(ips.get('median'), '.1f')} | {_ratio(r['ratio']) or '1.00'} | {cpu}"
                     f"{own} | {_f(rec.get('seconds_to_first_step'), '.1f')} | {_f(rec.get('peak_rss_mb'), '.0f')} | "
                     f"{_f(rec.get('peak_rss_mb_per_replica'), '.0f')} |")
    return lines


def workers_table(results: Mapping[str, Any]) -> list[str]:
    lines = ["| strategy | workers | images/s | speedup over 1 worker (paired) | efficiency |",
             "|---|---:|---:|---:|---:|"]
    for family, points in results.get("workers", {}).items():
        for p in points:
            lines.append(f"| {family} | {p['workers']} | {p['images_per_second']:.1f} | "
                         f"{_ratio(p['speedup_spread']) if p['workers'] > 1 else '1.00'} | {_f(p['efficiency'])} |")
    return lines


def allreduce_tables(section: Mapping[str, Any]) -> list[str]:
    from tfdist.bench import comm

    lines: list[str] = []
    for name in ("allreduce_2", "allreduce_4"):
        if name in section:
            lines += ["", f"All-reduce, {section[name]['workers']} worker processes ({name}):", "",
                      *comm.markdown(section[name])]
    traced = section.get("traced_step_2")
    if traced:
        kinds = traced.get("by_kind", {})
        parts = ", ".join(f"{name.replace('_', ' ')} {k['share']:.0%} ({k['count_per_step']:.0f})"
                          for name, k in kinds.items())
        lines += ["", f"Inside the real step (2 workers, the real loop traced with tf.profiler): "
                      f"{traced['count_per_step']:.0f} collectives per step are in flight "
                      f"{traced['collective_seconds_per_step'] * 1000:.1f} ms of a "
                      f"{traced['step_seconds'] * 1000:.1f} ms step ({traced['share']:.0%}, waiting for the peer "
                      f"included); by kind: {parts} (batch norm: named forward statistics; unscoped: batch norm's "
                      "backward and the step's stats; gradient: the optimizer's packed all-reduce)."]
    p = section.get("projection")
    if p:
        common = {"compute_seconds": p["compute_seconds"], "gradient_bytes": p["gradient_bytes"]}
        lines += ["", *comm.projection_markdown(p["tables"]["datacenter_alpha"], alpha_source="an assumed datacenter "
                                           "value, not measured", **common),
                  "", f"With this machine's fitted cost (alpha {p['fit']['alpha_seconds'] * 1e3:.2f} ms, "
                      f"B {p['fit']['bus_gbps']:.2f} GB/s over gRPC on 127.0.0.1, from the 2-worker sweep), "
                      "the same model gives: "
                  + ", ".join(f"{r['workers']} workers {r['efficiency']:.0%}" for r in p["tables"]["measured_alpha"]
                              if r["link_gbit"] == 25) + " (25 Gbit/s)."]
    return lines


def goals_table(results: Mapping[str, Any]) -> list[str]:
    """The goals on the wall clock (what ``met`` reads), and the same ratio on CPU time where it was measured."""
    on_cpu = _on_cpu(results)
    lines = ["| goal | value (paired median) | min | max | met |" + (" on CPU time (paired: median, min-max) |"
                                                                     if on_cpu else ""),
             "|---|---:|---:|---:|---|" + ("---:|" if on_cpu else "")]
    for g in results["goals"]:
        if g["value"] is None:  # its rows were not measured (``--only``)
            continue
        met = "" if g["met"] is None else ("yes" if g["met"] else "no")
        lines.append(f"| {g['goal']} | {_f(g['value'], '.3f')} | {_f(g['min'], '.3f')} | {_f(g['max'], '.3f')} | "
                     f"{met} |" + (f" {_ratio(g.get('cpu'))} |" if on_cpu else ""))
    return lines


def markdown(results: Mapping[str, Any]) -> str:
    """The results as Markdown: header, rows, workers, all-reduce, scaling, accuracy, preemption, goals."""
    lines = [*header(results), "", *rows_table(results)]
    if results.get("workers"):
        lines += ["", *workers_table(results)]
    if results.get("allreduce"):
        lines += allreduce_tables(results["allreduce"])
    if results.get("scaling"):
        lines += ["", "| epoch (one_device, its second epoch, measured) | image size | data | steps | seconds |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {s['name']} | {s['image_size']} | {s['factor']}x | {s['steps']} | {s['epoch_seconds']:.2f} |"
                  for s in results["scaling"]]
    if results.get("accuracy"):
        lines += ["", *accuracy_lib.markdown(results["accuracy"])]
    if results.get("preemption"):
        lines += ["", *preemption_lib.markdown(results["preemption"])]
    lines += ["", *goals_table(results)]
    return "\n".join(lines) + "\n"


def chart(results: Mapping[str, Any], path: str) -> None:
    """A bar chart of each row's paired ratio to the Keras baseline, with its min-max spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r.get("ratio")]
    medians = [r["ratio"]["median"] for r in rows]
    errors = [[m - r["ratio"]["min"] for m, r in zip(medians, rows)],
              [r["ratio"]["max"] - m for m, r in zip(medians, rows)]]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    ax.barh([r["name"] for r in rows], medians, xerr=errors, color="#4c72b0")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("images/s relative to plain Keras fit (one device), paired by repeat")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_docs(page: Path, root: Path | None = None) -> str:
    """``page``'s text with every ``<!-- bench: PATH -->`` block regenerated from its JSON (PATH from ``root``)."""
    root = root or page.parent.parent

    def block(match: re.Match) -> str:
        results = json.loads((root / match["path"]).read_text())
        if not isinstance(results, dict) or not {"rows", "goals"} <= results.keys():
            raise ValueError(f"{match['path']} holds {short(results, 40)}, not the results of tfdist.bench "
                             "(an object with rows and goals)")
        return match.group(1) + markdown(results) + match.group(4)

    return BLOCK.sub(block, page.read_text())


def write(results: Mapping[str, Any], *, output: Path, markdown_path: str | None = None,
          chart_path: str | None = None) -> str:
    """Write the JSON to ``output``, the tables and the chart beside it (by default); returns the tables."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    Path(markdown_path or output.with_suffix(".md")).write_text(table)
    chart(results, chart_path or str(output.with_suffix(".png")))
    return table
