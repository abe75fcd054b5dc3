"""The benchmark's report: medians, ratios to the Keras baseline, the goals, and the JSON, Markdown and PNG.

``results`` turns each row's runs into the JSON-ready results
(``{"baseline": {...}, "rows": [{"name", "images_per_second", "ratio", ...}],
"settings", "allreduce", "scaling", "preemption", "goals"}``); ``goals``,
``markdown`` and ``chart`` read that JSON shape, so a saved ``bench.json``
can be read the same way.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any, Mapping

import tfdist.bench.preemption as preemption_lib
from tfdist.bench.plan import ALLREDUCE_OF, BASELINE, Plan
from tfdist.bench.rows import BASE, Measured


def median(runs: list[Measured]) -> Measured:
    """The median of each number the first run measured; ``runs`` lists each run's images/s where there are several."""
    numbers = {k: statistics.median(getattr(r, k) for r in runs) for k, v in dataclasses.asdict(runs[0]).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    merged = dataclasses.replace(runs[0], **numbers)
    if len(runs) > 1:
        merged = dataclasses.replace(merged, runs=tuple(r.images_per_second for r in runs))
    return merged


def _numbers(measured: Measured) -> dict[str, Any]:
    return {k: v for k, v in measured.to_dict().items() if k != "name"}


def results(plan: Plan, runs: Mapping[str, list[Measured]], settings: Mapping[str, Any],
            preemption: Mapping[str, Any] | None = None) -> dict:
    """The JSON-ready results of ``plan``'s rows from their ``runs`` (by row name), goals included.

    ``preemption``: the preemption measurements' part (``preemption.run_all``), kept as it is under its own key.
    """
    measured = {row.spec.name: median(runs[row.spec.name]) for row in plan.rows}
    baseline = measured[BASELINE]
    rows = []
    for name, result in measured.items():
        ips = result.images_per_second
        rows.append({"name": name, "images_per_second": ips,
                     "ratio": ips / baseline.images_per_second if ips else None,
                     **{k: v for k, v in _numbers(result).items() if k != "images_per_second"}})
    out = {"baseline": baseline.to_dict(), "rows": rows, "settings": dict(settings)}
    if plan.allreduce is not None:
        allreduce = _numbers(median(runs[plan.allreduce.spec.name]))
        mwm = measured.get(ALLREDUCE_OF)
        if mwm:
            step_seconds = BASE["global_batch_size"] / mwm.images_per_second
            allreduce["share_of_step"] = allreduce["allreduce_seconds"] / step_seconds
        out["allreduce"] = allreduce
    if plan.scaling:
        out["scaling"] = []
        for row in plan.scaling:
            r = median(runs[row.spec.name])
            epoch_seconds = row.spec.steps * BASE["global_batch_size"] / r.images_per_second
            out["scaling"].append({"name": row.spec.name, "image_size": row.image_size, "factor": row.factor,
                                   "epoch_seconds": epoch_seconds, "peak_rss_mb": r.peak_rss_mb,
                                   "rss_growth_mb": r.rss_growth_mb})
    if preemption is not None:
        out["preemption"] = dict(preemption)
    out["goals"] = goals(out)
    return out


def goals(results: Mapping[str, Any]) -> list[dict]:
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


def markdown(results: Mapping[str, Any]) -> str:
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
    if results.get("preemption"):
        lines += ["", *preemption_lib.markdown(results["preemption"])]
    lines += ["", "| goal | value | met |", "|---|---:|---|"]
    for g in results["goals"]:
        value = "" if g["value"] is None else f"{g['value']:.3f}"
        lines.append(f"| {g['goal']} | {value} | {'' if g['met'] is None else ('yes' if g['met'] else 'no')} |")
    return "\n".join(lines) + "\n"


def chart(results: Mapping[str, Any], path: str) -> None:
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


def write(results: Mapping[str, Any], *, output: Path, markdown_path: str | None = None,
          chart_path: str | None = None) -> str:
    """Write the JSON to ``output``, the table and the chart beside it (by default); returns the table."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    Path(markdown_path or output.with_suffix(".md")).write_text(table)
    chart(results, chart_path or str(output.with_suffix(".png")))
    return table
