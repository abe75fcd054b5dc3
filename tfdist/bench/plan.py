"""The benchmark's plan: which rows to measure, and which processes run them.

Rows that need the same process set-up share one process (start-up is most
of a short row's time): the one-logical-CPU rows (``cpu1``) and the
two-logical-CPU rows (``cpu2``) each run one after another, ``--repeats``
times interleaved, so a slow moment of the machine hits every row alike.
Rows with a cluster (collectives, gRPC servers) get fresh processes per run,
since a cluster cannot be torn down. The preemption measurements
(``tfdist.bench.preemption``) start their own ``python -m tfdist.train``
processes, once each; ``--only`` names them like rows.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfdist.bench.preemption import PreemptionSpec, preemption_specs
from tfdist.bench.rows import BASE, Job, Row, RowSpec, ScalingRow
from tfdist.errors import UserError
from tfdist.strategies import traits

#: The baseline: every ratio is to this row, so it runs whatever ``--only`` says.
BASELINE = "keras_fit"
#: The all-reduce row runs with the row whose step it is a share of.
ALLREDUCE = "allreduce_2_workers"
ALLREDUCE_OF = "multi_worker_mirrored_2"


def rows_for(steps: int, warmup: int) -> list[Row]:
    """Every throughput row: its spec, and its ``group`` (rows that share a process) or ``processes``."""

    def tfdist(name: str, strategy: str, cpu_devices: int = 1) -> RowSpec:
        return RowSpec(name=name, kind="tfdist", strategy=strategy, steps=steps, warmup=warmup,
                       overrides={"cpu_devices": cpu_devices})

    def parameter_server(name: str, workers: int) -> RowSpec:
        # One chunk of closures (tfdist's default per wait) warms up, as it traces; the timed steps are whole chunks.
        chunk = traits("parameter_server").default_steps_per_loop
        return dataclasses.replace(tfdist(name, "parameter_server"), kind="parameter_server", workers=workers,
                                   warmup=chunk, steps=chunk * max(1, -(-steps // chunk)))

    return [
        Row(group="cpu1", spec=RowSpec(name=BASELINE, kind="keras_fit", steps=steps)),
        Row(group="cpu1", spec=tfdist("one_device", "one_device")),
        Row(group="cpu1", spec=tfdist("mirrored_1", "mirrored", 1)),
        Row(group="cpu2", spec=tfdist("mirrored_2", "mirrored", 2)),
        Row(group="cpu2", spec=tfdist("central_storage_2", "central_storage", 2)),
        Row(processes=1, spec=tfdist("multi_worker_mirrored_1", "multi_worker_mirrored")),
        Row(processes=2, spec=tfdist(ALLREDUCE_OF, "multi_worker_mirrored")),
        Row(processes=1, spec=parameter_server("parameter_server_1", 1)),
        Row(processes=1, spec=parameter_server("parameter_server_2", 2)),
        Row(group="cpu1", spec=RowSpec(name="input_pipeline", kind="pipeline", strategy="one_device", steps=steps,
                                       warmup=warmup)),
    ]


def scaling_rows(steps_at_1x: int) -> list[ScalingRow]:
    """Time per epoch (one_device) at 1x/2x/4x the data at 32 px, and 1x/2x at 64 px."""
    rows = []
    for size, factors in ((32, (1, 2, 4)), (64, (1, 2))):
        for factor in factors:
            rows.append(ScalingRow(group="cpu1", image_size=size, factor=factor, spec=RowSpec(
                name=f"epoch_{size}px_{factor}x", kind="tfdist", strategy="one_device",
                steps=steps_at_1x * factor, warmup=0,
                overrides={"image_size": size, "train_examples": BASE["global_batch_size"] * steps_at_1x * factor})))
    return rows


def allreduce_row(steps: int, warmup: int) -> Row:
    """The all-reduce of the model's gradients under 2-worker ``multi_worker_mirrored``."""
    return Row(processes=2, spec=RowSpec(name=ALLREDUCE, kind="allreduce", strategy="multi_worker_mirrored",
                                         steps=steps, warmup=warmup))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The rows of one benchmark run.

    Attributes:
      rows: the table's rows, the baseline first where ``--only`` left it out.
      allreduce: the all-reduce row, or ``None``.
      scaling: the time-per-epoch rows (only when every row runs).
      preemption: the preemption measurements (run by the parent, not in ``every_row``).
    """

    rows: tuple[Row, ...]
    allreduce: Row | None
    scaling: tuple[ScalingRow, ...]
    preemption: tuple[PreemptionSpec, ...] = ()

    @property
    def every_row(self) -> list[Row]:
        return [*self.rows, *([self.allreduce] if self.allreduce else []), *self.scaling]


def plan(*, steps: int, warmup: int, only: Sequence[str] = (), scaling_steps: int = 0,
         preemption: bool = False) -> Plan:
    """The rows named in ``only`` (all where empty), and the all-reduce, scaling and preemption rows that go with them.

    Args:
      steps: timed steps per row.
      warmup: steps before the timing starts.
      only: row names (``--only``), preemption measurements' included; the baseline runs whatever it says.
      scaling_steps: steps per epoch of the 1x scaling rows; 0: no scaling rows.
      preemption: the preemption measurements too (those named in ``only``, where it names rows).

    Raises:
      UserError: a name in ``only`` is not a row's, or names a preemption measurement without ``preemption``.
    """
    known = rows_for(steps, warmup)
    preemptions = preemption_specs()
    names = [r.spec.name for r in known] + [s.name for s in preemptions]
    if any(name not in names for name in only):
        raise UserError(f"Invalid value for `--only`. Received: {','.join(only)}. "
                        f"Expected names among: {', '.join(names)}.")
    if not preemption and any(s.name in only for s in preemptions):
        raise UserError(f"Invalid value for `--only` with `--nopreemption`. Received: {','.join(only)}. "
                        "Expected no preemption_* name, or no `--nopreemption`.")
    rows = [r for r in known if not only or r.spec.name in only]
    if BASELINE not in {r.spec.name for r in rows}:
        rows.insert(0, known[0])  # every ratio needs the baseline
    return Plan(rows=tuple(rows),
                allreduce=allreduce_row(steps, warmup) if not only or ALLREDUCE_OF in only else None,
                scaling=tuple(scaling_rows(scaling_steps)) if scaling_steps and not only else (),
                preemption=tuple(s for s in preemptions if preemption and (not only or s.name in only)))


def jobs_for(rows: Sequence[Row], repeats: int) -> list[Job]:
    """The processes to launch: one per group (its rows ``repeats`` times, interleaved), else one per run.

    Rows marked ``once`` (scaling: a time per epoch, not a ratio) run once, after the group's repeats.
    A group's job takes the place of its first row.
    """
    order: list[str | Job] = []  # a group's name stands where its job goes
    repeated: dict[str, list[RowSpec]] = {}
    once: dict[str, list[RowSpec]] = {}
    for row in rows:
        if row.group is None:
            order += [Job(rows=(row.spec,), processes=row.processes)] * repeats
            continue
        if row.group not in repeated:
            repeated[row.group], once[row.group] = [], []
            order.append(row.group)
        (once if row.once else repeated)[row.group].append(row.spec)
    return [Job(rows=tuple(repeated[j] * repeats + once[j])) if isinstance(j, str) else j for j in order]
