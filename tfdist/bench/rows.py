"""The benchmark's values: what a row measures, where it runs, what a child measured.

Frozen, keyword-only dataclasses instead of dicts with string keys: the
planner makes ``Row``s, groups their ``RowSpec``s into ``Job``s, a child gets
its specs as a ``ChildJob`` on its command line and answers one
``Measured`` per row on stdout, and the report turns medians of those into
the JSON. ``BASE`` is the one experiment every row trains.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Mapping

#: The benchmark's experiment: the default UNet at the default size and batch.
BASE = {"image_size": 32, "train_examples": 256, "eval_examples": 32, "global_batch_size": 16,
        "base_filters": 16, "depth": 3, "log_every": 1000, "checkpoint_every": 100000, "eval_steps": 1,
        "deterministic": False, "augment": False, "export": False}

#: How a child's stdout marks its result lines (one per row; anything else on stdout is ignored).
RESULT_PREFIX = "BENCH "

Kind = Literal["keras_fit", "tfdist", "parameter_server", "pipeline", "allreduce"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowSpec:
    """What one row measures, as a child process is told it.

    Attributes:
      name: the row's name in the table (and in ``--only``).
      kind: which measurement runs it (``tfdist.bench.measure``).
      steps: timed steps.
      warmup: steps (or loop calls) before the timing starts; ``keras_fit`` times its second epoch instead.
      strategy: the tfdist strategy (``None`` for ``keras_fit``, which uses none).
      overrides: experiment values over ``BASE`` (e.g. ``cpu_devices``, ``image_size``).
      workers: worker tasks of the in-process cluster (``parameter_server`` only).
      bytes_per_pack: all-reduce packing (``allreduce`` only; 0: TensorFlow's default).
    """

    name: str
    kind: Kind
    steps: int
    warmup: int = 0
    strategy: str | None = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    workers: int = 0
    bytes_per_pack: int = 0

    def experiment(self) -> dict[str, Any]:
        """``BASE`` with this row's overrides."""
        return {**BASE, **self.overrides}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """A row to measure and where it runs.

    Rows of one ``group`` share a process (start-up is most of a short row's
    time); a row without a group gets ``processes`` fresh processes for each
    run (a cluster cannot be torn down). A row marked ``once`` runs once,
    after its group's repeats.
    """

    spec: RowSpec
    group: str | None = None
    processes: int = 1
    once: bool = False

    def __post_init__(self) -> None:
        if self.group is not None and self.processes != 1:
            raise ValueError(f"A row of group {self.group!r} runs in its group's one process, "
                             f"not in {self.processes}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalingRow(Row):
    """A time-per-epoch row (one run, not a ratio): ``factor`` times the data at ``image_size``."""

    once: bool = True
    image_size: int
    factor: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """Rows that run one after another in each of ``processes`` processes (a cluster's tasks when 2 or more)."""

    rows: tuple[RowSpec, ...]
    processes: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChildJob:
    """What a child process is given with ``--child``: its rows, and when it was spawned (start-up counts from then)."""

    rows: tuple[RowSpec, ...]
    spawned_at: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildJob:
        data = json.loads(text)
        return cls(rows=tuple(RowSpec(**row) for row in data["rows"]), spawned_at=data["spawned_at"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measured:
    """One row's numbers: one run as its child measured it, or the median of several (``runs``).

    ``None`` is "not measured by this kind of row" and is left out of the
    JSON. Field order is the JSON's key order.

    Attributes:
      name: the row's name.
      images_per_second: training throughput after warm-up (all but ``allreduce``).
      num_replicas: the strategy's replicas (tfdist rows).
      cached_images_per_second: the same steps fed from cached tensors (``pipeline``).
      ratio_to_cached: ``images_per_second / cached_images_per_second`` (``pipeline``).
      allreduce_seconds: one all-reduce of the model's gradients (``allreduce``).
      gradient_mb: the size of those gradients (``allreduce``).
      seconds_to_first_step: the process's start-up plus the row's build, trace and first step.
      peak_rss_mb: the process's memory high-water mark since the row started (of all its processes).
      row_seconds: the row's wall time in its process.
      rss_growth_mb: that peak less the memory the process held when the row started.
      runs: each run's ``images_per_second``, where this is the median of several runs.
    """

    name: str
    images_per_second: float | None = None
    num_replicas: int | None = None
    cached_images_per_second: float | None = None
    ratio_to_cached: float | None = None
    allreduce_seconds: float | None = None
    gradient_mb: float | None = None
    seconds_to_first_step: float | None = None
    peak_rss_mb: float | None = None
    row_seconds: float | None = None
    rss_growth_mb: float | None = None
    runs: tuple[float | None, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The measured fields, in order (``None`` left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def to_line(self) -> str:
        """The child's stdout line for this result."""
        return RESULT_PREFIX + json.dumps(self.to_dict())

    @classmethod
    def from_line(cls, line: str) -> Measured:
        return cls(**json.loads(line[len(RESULT_PREFIX):]))
