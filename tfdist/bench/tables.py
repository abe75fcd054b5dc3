"""The benchmark's results as Markdown tables and a PNG chart, and the generated blocks of
``docs/benchmarks.md``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import tfdist.bench.accuracy as accuracy_lib
import tfdist.bench.preemption as preemption_lib
from tfdist.errors import short

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


def header(results: Mapping[str, Any]) -> list[str]:
    """Where and how the results were measured: machine, versions, settings."""
    m, v, s = results.get("machine", {}), results.get("versions", {}), results.get("settings", {})
    return [f"Measured {m.get('date', '?')} on {m.get('cpu_model', '?')} ({m.get('cpus', '?')} CPUs, "
            f"{_f(m.get('memory_gb'), '.0f')} GB, {m.get('gpus', 'no')} GPU); Python {v.get('python', '?')}, "
            f"TensorFlow {v.get('tensorflow', '?')}, Keras {v.get('keras', '?')}, tfdist {v.get('tfdist', '?')}. "
            f"{s.get('repeats', '?')} repeat(s), {s.get('warmup', '?')} warm-up steps then {s.get('steps', '?')} "
            f"timed steps on every side; {_f(m.get('wall_seconds'), '.0f')} s in all."]


def rows_table(results: Mapping[str, Any]) -> list[str]:
    lines = ["| row | images/s (median of repeats) | ratio to keras_fit (paired: median, min-max) | "
             "ratio to its own baseline | s to first step | peak RSS MB (all processes) | MB per replica |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for r in results["rows"]:
        ips, rec = r.get("images_per_second") or {}, r["record"]
        own = "; ".join(f"{_ratio(o)} to {o['to']}" for o in (r.get("ratio_to_baseline"), r.get("ratio_to_keras"))
                        if o)
        lines.append(f"| {r['name']} | {_f(ips.get('median'), '.1f')} | {_ratio(r['ratio']) or '1.00'} | {own} | "
                     f"{_f(rec.get('seconds_to_first_step'), '.1f')} | {_f(rec.get('peak_rss_mb'), '.0f')} | "
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
    from tfdist.bench import comm, projection

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
        lines += ["", *projection.markdown(p["tables"]["datacenter_alpha"], alpha_source="an assumed datacenter "
                                           "value, not measured", **common),
                  "", f"With this machine's fitted cost (alpha {p['fit']['alpha_seconds'] * 1e3:.2f} ms, "
                      f"B {p['fit']['bus_gbps']:.2f} GB/s over gRPC on 127.0.0.1, from the 2-worker sweep), "
                      "the same model gives: "
                  + ", ".join(f"{r['workers']} workers {r['efficiency']:.0%}" for r in p["tables"]["measured_alpha"]
                              if r["link_gbit"] == 25) + " (25 Gbit/s)."]
    return lines


def goals_table(results: Mapping[str, Any]) -> list[str]:
    lines = ["| goal | value (paired median) | min | max | met |", "|---|---:|---:|---:|---|"]
    for g in results["goals"]:
        if g["value"] is None:  # its rows were not measured (``--only``)
            continue
        met = "" if g["met"] is None else ("yes" if g["met"] else "no")
        lines.append(f"| {g['goal']} | {_f(g['value'], '.3f')} | {_f(g['min'], '.3f')} | {_f(g['max'], '.3f')} | "
                     f"{met} |")
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
