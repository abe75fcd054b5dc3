"""The benchmark's plan: which rows to measure, in which fresh processes, in which order (each row next to the
row it is compared to, odd repeats backwards).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfdist.bench.accuracy import AccuracySpec, accuracy_specs
from tfdist.bench.preemption import PreemptionSpec, preemption_specs
from tfdist.bench.rows import BASE, Job, Row, RowSpec, ScalingRow
from tfdist.errors import UserError
from tfdist.strategies import traits

#: The baseline: every row has a ratio to it, so it runs whatever ``--only`` says.
BASELINE = "keras_fit"
#: Worker counts of the scaling-with-workers rows (``multi_worker_mirrored_N``, ``parameter_server_N``).
WORKERS = (1, 2, 3, 4)
#: XLA and bfloat16, each beside its float32, no-XLA rows: Keras' fit, tfdist.fit and the UNet on one device.
COMPILE_VARIANTS = {"jit": {"jit_compile": True}, "mixed_bfloat16": {"precision": "mixed_bfloat16"}}
#: The normalizations compared under 2-worker multi_worker_mirrored (``--norm``; "none" is ``--nobatch_norm``).
NORMS = ("group", "replica_batch", "none")
#: The small Keras models (``measure.small_experiment``): their global batch, and their timed steps per the
#: UNet's (their steps cost a fraction of its, so a window as long takes more of them).
SMALL_MODELS = {"dense": {"global_batch_size": 64, "steps_factor": 50}, "conv": {"global_batch_size": 32,
                                                                                "steps_factor": 8}}


def rows_for(steps: int, warmup: int) -> list[Row]:
    """Every row measured in the repeats: its spec and its processes, in the order of a repeat."""
    per_worker = BASE["global_batch_size"]

    def keras(name: str, strategy: str | None = None, cpu_devices: int = 1, **overrides) -> RowSpec:
        return RowSpec(name=name, kind="keras_fit", strategy=strategy, steps=steps, warmup=warmup,
                       overrides={"cpu_devices": cpu_devices, **overrides})

    def fit(name: str, strategy: str, cpu_devices: int = 1, overrides=None, **fields) -> RowSpec:
        # tfdist.fit on the Keras rows' model and arrays; its last epoch is timed (measure._measure_tfdist_fit).
        return RowSpec(name=name, kind="tfdist_fit", strategy=strategy, steps=steps, warmup=warmup, epochs=2,
                       overrides={"cpu_devices": cpu_devices, **(overrides or {})}, **fields)

    def tfdist(name: str, strategy: str, cpu_devices: int = 1, **fields) -> RowSpec:
        overrides = {"cpu_devices": cpu_devices, **fields.pop("overrides", {})}
        return RowSpec(name=name, kind="tfdist", strategy=strategy, steps=steps, warmup=warmup, overrides=overrides,
                       **fields)

    def multi_worker(workers: int, suffix: str = "", **overrides) -> Row:
        # Weak scaling: 16 images per worker and step, as on one device.
        baseline = "multi_worker_mirrored_1" if workers > 1 else None
        keras_baseline = "keras_fit_multi_worker_mirrored_2" if workers == 2 and not suffix else None
        spec = tfdist(f"multi_worker_mirrored_{workers}{suffix}", "multi_worker_mirrored", workers=workers,
                      baseline=f"multi_worker_mirrored_{workers}" if suffix else baseline,
                      keras_baseline=keras_baseline,
                      overrides={"global_batch_size": per_worker * workers, **overrides})
        return Row(processes=workers, spec=spec)

    def parameter_server(workers: int) -> Row:
        # One chunk of closures (tfdist's default per wait) warms up; the window is whole chunks.
        chunk = traits("parameter_server").default_steps_per_loop
        spec = dataclasses.replace(tfdist(f"parameter_server_{workers}", "parameter_server"), kind="parameter_server",
                                   workers=workers, warmup=chunk, steps=chunk * max(1, -(-steps // chunk)),
                                   baseline="parameter_server_1" if workers > 1 else None)
        return Row(spec=spec)

    def once(name: str, kind: str, workers: int) -> Row:
        return Row(processes=workers, once=True, spec=RowSpec(name=name, kind=kind, strategy="multi_worker_mirrored",
                                                              steps=steps, warmup=warmup, workers=workers))

    keras_multi_worker = RowSpec(name="keras_fit_multi_worker_mirrored_2", kind="keras_fit", workers=2,
                                 strategy="multi_worker_mirrored", steps=steps, warmup=warmup,
                                 overrides={"cpu_devices": 1, "global_batch_size": per_worker * 2})
    def small_model(model: str) -> list[Row]:
        # Keras' own fit and tfdist.fit on one device, two local CPUs and two workers, each timed by its last
        # epoch whole (epoch hooks alone); "after setup": Keras' fit under the strategy tfdist.setup returns.
        per = SMALL_MODELS[model]
        base = {"model": model, "global_batch_size": per["global_batch_size"]}
        times = {"steps": steps * per["steps_factor"], "warmup": warmup * per["steps_factor"], "epochs": 2}

        def row(name, kind, strategy=None, cpu_devices=1, processes=1, baseline=None, **overrides) -> Row:
            batch = per["global_batch_size"] * processes
            return Row(processes=processes, spec=RowSpec(
                name=f"{name}_{model}", kind=kind, strategy=strategy, workers=processes, baseline=baseline,
                overrides={**base, "cpu_devices": cpu_devices, "global_batch_size": batch, **overrides}, **times))

        keras_one, keras_mirrored = f"keras_fit_{model}", f"keras_fit_mirrored_2_{model}"
        return [row("keras_fit", "keras_fit"),
                row("tfdist_fit", "tfdist_fit", "one_device", baseline=keras_one),
                row("keras_fit_mirrored_2", "keras_fit", "mirrored", 2, baseline=keras_one),
                row("tfdist_fit_mirrored_2", "tfdist_fit", "mirrored", 2, baseline=keras_mirrored),
                row("keras_fit_setup_mirrored_2", "keras_fit", "mirrored", 2, baseline=keras_mirrored, setup=True),
                row("keras_fit_setup_multi_worker_mirrored_2", "keras_fit", "multi_worker_mirrored", processes=2,
                    baseline=keras_one, setup=True),
                row("tfdist_fit_multi_worker_mirrored_2", "tfdist_fit", "multi_worker_mirrored", processes=2,
                    baseline=f"keras_fit_setup_multi_worker_mirrored_2_{model}")]

    norm_values = {"group": {"norm": "group"}, "replica_batch": {"norm": "replica_batch"},
                   "none": {"batch_norm": False}}
    return [
        Row(spec=keras(BASELINE)),
        Row(spec=fit("tfdist_fit", "one_device")),
        Row(spec=tfdist("one_device", "one_device")),
        *(row for name, overrides in COMPILE_VARIANTS.items() for row in (
            Row(spec=keras(f"keras_fit_{name}", **overrides)),
            Row(spec=fit(f"tfdist_fit_{name}", "one_device", overrides=overrides, baseline="tfdist_fit")),
            Row(spec=tfdist(f"one_device_{name}", "one_device", overrides=overrides, baseline="one_device")))),
        Row(spec=tfdist("mirrored_1", "mirrored", 1)),
        *(row for model in SMALL_MODELS for row in small_model(model)),
        Row(spec=RowSpec(name="input_pipeline", kind="pipeline", strategy="one_device", steps=steps, warmup=warmup)),
        Row(spec=keras("keras_fit_mirrored_2", "mirrored", 2)),
        Row(spec=fit("tfdist_fit_mirrored_2", "mirrored", 2, baseline="keras_fit_mirrored_2")),
        Row(spec=tfdist("mirrored_2", "mirrored", 2, baseline="keras_fit_mirrored_2")),
        Row(spec=dataclasses.replace(keras("keras_fit_setup_mirrored_2", "mirrored", 2, setup=True),
                                     baseline="keras_fit_mirrored_2")),
        Row(spec=keras("keras_fit_central_storage_2", "central_storage", 2)),
        Row(spec=tfdist("central_storage_2", "central_storage", 2, baseline="keras_fit_central_storage_2")),
        multi_worker(1),
        Row(processes=2, spec=keras_multi_worker),
        multi_worker(2),
        Row(processes=2, spec=fit("tfdist_fit_multi_worker_mirrored_2", "multi_worker_mirrored", workers=2,
                                  overrides={"global_batch_size": per_worker * 2},
                                  baseline="keras_fit_multi_worker_mirrored_2")),
        *(multi_worker(n) for n in WORKERS[2:]),
        *(multi_worker(2, f"_{norm}_norm", **norm_values[norm]) for norm in NORMS),
        *(parameter_server(n) for n in WORKERS),
        once("allreduce_2", "comm", 2),
        once("allreduce_4", "comm", 4),
        once("traced_step_2", "trace", 2),
    ]


def scaling_rows(steps_at_1x: int) -> list[ScalingRow]:
    """Time per epoch (one_device, measured: its second epoch) at 1x/2x/4x the data at 32 px, and 1x/2x at 64 px."""
    rows = []
    for size, factors in ((32, (1, 2, 4)), (64, (1, 2))):
        for factor in factors:
            rows.append(ScalingRow(group="scaling", image_size=size, factor=factor, spec=RowSpec(
                name=f"epoch_{size}px_{factor}x", kind="tfdist", strategy="one_device",
                steps=steps_at_1x * factor, epochs=2,
                overrides={"image_size": size, "train_examples": BASE["global_batch_size"] * steps_at_1x * factor})))
    return rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The rows of one benchmark run.

    Attributes:
      rows: the repeated rows (and the once-only ones), the baseline first.
      scaling: the time-per-epoch rows (only when every row runs).
      accuracy: the time-to-accuracy measurements (run by the parent).
      preemption: the preemption measurements (run by the parent).
    """

    rows: tuple[Row, ...]
    scaling: tuple[ScalingRow, ...] = ()
    accuracy: tuple[AccuracySpec, ...] = ()
    preemption: tuple[PreemptionSpec, ...] = ()

    @property
    def every_row(self) -> list[Row]:
        return [*self.rows, *self.scaling]


def plan(*, steps: int, warmup: int, only: Sequence[str] = (), scaling_steps: int = 0, accuracy: bool = False,
         preemption: bool = False) -> Plan:
    """The rows named in ``only`` (all where empty), with the rows their ratios need.

    Args:
      steps: timed steps per row.
      warmup: steps before the timing starts.
      only: row names (``--only``), the parent's measurements' included; the baseline, and each named row's
        own baseline, run whatever it says.
      scaling_steps: steps per epoch of the 1x scaling rows; 0: no scaling rows.
      accuracy, preemption: the time-to-accuracy / preemption measurements too (those named in ``only``, where it
        names rows).

    Raises:
      UserError: a name in ``only`` is not a row's, or names a measurement that its flag turned off.
    """
    known = rows_for(steps, warmup)
    parents = {"--time_to_accuracy": (accuracy, accuracy_specs()), "--preemption": (preemption, preemption_specs())}
    names = [r.spec.name for r in known] + [s.name for _, specs in parents.values() for s in specs]
    if any(name not in names for name in only):
        raise UserError(f"Invalid value for `--only`. Received: {','.join(only)}. "
                        f"Expected names among: {', '.join(names)}.")
    for flag, (on, specs) in parents.items():
        if not on and any(s.name in only for s in specs):
            raise UserError(f"Invalid value for `--only` without `{flag}`. Received: {','.join(only)}. "
                            f"Expected `{flag}` with those names, or none of them.")
    wanted = set(only) | {BASELINE}
    by_name = {r.spec.name: r for r in known}
    todo = list(wanted)
    while todo:  # a row's ratios need its own baselines (and theirs)
        row = by_name.get(todo.pop())
        for name in (row.spec.baseline, row.spec.keras_baseline) if row else ():
            if name and name not in wanted:
                wanted.add(name)
                todo.append(name)
    chosen = [s for s in [*accuracy_specs(), *preemption_specs()] if not only or s.name in only]
    return Plan(rows=tuple(r for r in known if not only or r.spec.name in wanted),
                scaling=tuple(scaling_rows(scaling_steps)) if scaling_steps and not only else (),
                accuracy=tuple(s for s in chosen if accuracy and isinstance(s, AccuracySpec)),
                preemption=tuple(s for s in chosen if preemption and isinstance(s, PreemptionSpec)))


def jobs_for(rows: Sequence[Row], repeats: int) -> list[Job]:
    """The processes to launch, in order: ``repeats`` repeats of every row (odd ones reversed), then the groups.

    A row marked ``once`` runs in the first repeat only; a group's rows share one job, once, at the end.
    """
    single = [row for row in rows if row.group is None]
    jobs = []
    for repeat in range(repeats):
        order = single if repeat % 2 == 0 else single[::-1]
        jobs += [Job(rows=(row.spec,), processes=row.processes, repeat=repeat) for row in order
                 if not row.once or repeat == 0]
    groups: dict[str, list[RowSpec]] = {}
    for row in rows:
        if row.group is not None:
            groups.setdefault(row.group, []).append(row.spec)
    return jobs + [Job(rows=tuple(specs)) for specs in groups.values()]
