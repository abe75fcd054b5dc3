"""The benchmark's results: ratios paired repeat by repeat, one repeat's record per row, scaling and goals."""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from tfdist.bench.plan import BASELINE, WORKERS, Plan
from tfdist.bench.rows import Measured


def spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "runs"}`` of ``values`` (one per repeat)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def paired(runs: Sequence[Measured], baseline: Sequence[Measured]) -> dict[str, Any] | None:
    """Each repeat's ``runs`` images/s over ``baseline``'s in the same repeat, as a ``spread``; None: no pair."""
    by_repeat = {m.repeat: m.images_per_second for m in baseline}
    ratios = [m.images_per_second / by_repeat[m.repeat] for m in runs
              if m.images_per_second and by_repeat.get(m.repeat)]
    return spread(ratios) if ratios else None


def median_record(runs: Sequence[Measured], keys: Sequence[float]) -> Measured:
    """The run whose key is the median one (the lower of the two middle ones for an even count)."""
    order = sorted(range(len(runs)), key=lambda i: keys[i])
    return runs[order[(len(runs) - 1) // 2]]


def _row(spec, runs: list[Measured], measured: Mapping[str, list[Measured]]) -> dict[str, Any]:
    """One row of the JSON: its paired ratios, its images/s spread, and its median repeat's record."""
    ratio = paired(runs, measured[BASELINE]) if spec.name != BASELINE else None
    keys = ratio["runs"] if ratio and len(ratio["runs"]) == len(runs) else [m.images_per_second or 0 for m in runs]
    record = median_record(runs, keys)
    row = {"name": spec.name, "kind": spec.kind, "strategy": spec.strategy, "workers": spec.workers,
           "images_per_second": spread([m.images_per_second for m in runs]) if record.images_per_second else None,
           "ratio": ratio}
    if spec.baseline and spec.baseline in measured:
        row["ratio_to_baseline"] = {"to": spec.baseline, **(paired(runs, measured[spec.baseline]) or {})}
    if spec.keras_baseline and spec.keras_baseline in measured:
        row["ratio_to_keras"] = {"to": spec.keras_baseline, **(paired(runs, measured[spec.keras_baseline]) or {})}
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
        from tfdist.bench import projection

        traced = out.get("traced_step_2", {}).get("by_kind", {})
        small = round(sum(traced.get(k, {}).get("count_per_step", 0) for k in ("batch_norm", "unscoped")))
        compute = one["record"]["global_batch_size"] / one["images_per_second"]["median"]
        common = {"compute_seconds": compute, "gradient_bytes": two["gradient_bytes"], "latency_allreduces": small}
        fitted = projection.fit_cost(two["sweep"])
        out["projection"] = {**common, "fit": fitted, "tables": {
            "datacenter_alpha": projection.table(alpha=projection.DATACENTER_ALPHA_SECONDS, **common),
            "measured_alpha": projection.table(alpha=fitted["alpha_seconds"], **common)}}
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
    ]
    out = []
    for goal, value, at_least in checks:
        median = None if not value or value.get("median") is None else value["median"]
        out.append({"goal": goal, "value": median, "min": (value or {}).get("min"), "max": (value or {}).get("max"),
                    "met": None if median is None else median >= at_least})
    out.append({"goal": "multi_worker_mirrored_2 collectives <= 15% of the real step", "value": share,
                "min": None, "max": None, "met": None if share is None else share <= 0.15})
    return out
