"""The benchmark's values as frozen dataclasses: a ``Row`` to measure, a ``Job`` that runs it, a child's
``Measured`` answer.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Mapping

#: The benchmark's experiment: the default UNet at the default size, 16 images per worker and step.
BASE = {"image_size": 32, "train_examples": 256, "eval_examples": 32, "global_batch_size": 16,
        "base_filters": 16, "depth": 3, "log_every": 1000, "checkpoint_every": 100000, "eval_steps": 1,
        "deterministic": False, "augment": False, "export": False}

#: How a child's stdout marks its result lines (one per row; anything else on stdout is ignored).
RESULT_PREFIX = "BENCH "

Kind = Literal["keras_fit", "tfdist", "tfdist_fit", "parameter_server", "pipeline", "comm", "trace"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowSpec:
    """What one row measures, as a child process is told it.

    Attributes:
      name: the row's name in the table (and in ``--only``).
      kind: which measurement runs it (``tfdist.bench.measure``).
      steps: timed steps (the window: from the end of step ``warmup`` to the end of step ``warmup + steps``;
        ``tfdist_fit``: epochs of ``warmup + steps`` steps, the last one timed whole).
      warmup: steps before the window, the same for Keras and tfdist (``parameter_server``: one chunk).
      strategy: the tfdist strategy (``keras_fit``: the strategy Keras' ``fit`` runs under; None: none;
        ``tfdist_fit``: the strategy ``tfdist.fit`` runs under).
      overrides: experiment values over ``BASE`` (e.g. ``cpu_devices``, ``image_size``, ``norm``).
      workers: worker tasks (``parameter_server``: of the in-process cluster; else the processes).
      baseline: the row this one's paired ratio is to, besides ``keras_fit`` (Keras under the same strategy,
        or the same strategy with one worker); None: ``keras_fit`` only.
      keras_baseline: Keras' ``fit`` under the same strategy, where that is not ``baseline``: one more paired
        ratio (``multi_worker_mirrored_2``: ``baseline`` is its 1-worker row); None: none.
      epochs: epochs of the run (scaling and ``tfdist_fit`` rows time their last epoch; 1 elsewhere).
    """

    name: str
    kind: Kind
    steps: int
    warmup: int = 0
    strategy: str | None = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    workers: int = 1
    baseline: str | None = None
    keras_baseline: str | None = None
    epochs: int = 1

    def experiment(self) -> dict[str, Any]:
        """``BASE`` with this row's overrides."""
        return {**BASE, **self.overrides}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """A row to measure and where it runs.

    Each run of a row gets ``processes`` fresh processes (a cluster's tasks
    when 2 or more), so that its start-up and memory are its own. Rows of one
    ``group`` (the time-per-epoch rows) share a process and run once, after
    the repeats. A row marked ``once`` runs in the first repeat only (no
    ratio: the all-reduce sweeps and the traced step).
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
    """Rows that run one after another in each of ``processes`` processes, in repeat ``repeat``."""

    rows: tuple[RowSpec, ...]
    processes: int = 1
    repeat: int = 0


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
    """One run of one row, as its child (or the parent, summing its processes) measured it.

    ``None`` is "not measured by this kind of row" and is left out of the
    JSON. Field order is the JSON's key order.

    Attributes:
      name: the row's name.
      repeat: which repeat of the benchmark this run belongs to (the pairing of ratios).
      images_per_second: training throughput in the timed window (all images of all workers).
      cpu_seconds_per_step: the CPU time (every thread) the row's processes spent per step of the same window,
        summed over the processes: what a step costs whatever else the machine runs.
      global_batch_size: images per step (all replicas, all workers).
      num_replicas: the strategy's replicas.
      cached_images_per_second: the same steps fed from cached tensors (``pipeline``).
      ratio_to_cached: ``images_per_second / cached_images_per_second`` (``pipeline``).
      epoch_seconds: the wall time of the last epoch, measured (scaling rows).
      seconds_to_first_step: spawn of the process (the cluster's) to the end of its first step.
      peak_rss_mb: the peak resident memory of the row's processes, summed.
      processes: how many processes that sum is over.
      row_seconds: the row's wall time in its process.
      details: kind-specific results (the all-reduce sweeps, the traced step's collectives).
    """

    name: str
    repeat: int = 0
    images_per_second: float | None = None
    cpu_seconds_per_step: float | None = None
    global_batch_size: int | None = None
    num_replicas: int | None = None
    cached_images_per_second: float | None = None
    ratio_to_cached: float | None = None
    epoch_seconds: float | None = None
    seconds_to_first_step: float | None = None
    peak_rss_mb: float | None = None
    processes: int | None = None
    row_seconds: float | None = None
    details: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The measured fields, in order (``None`` left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def to_line(self) -> str:
        """The child's stdout line for this result."""
        return RESULT_PREFIX + json.dumps(self.to_dict())

    @classmethod
    def from_line(cls, line: str) -> Measured:
        return cls(**json.loads(line[len(RESULT_PREFIX):]))
