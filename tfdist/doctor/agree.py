"""What the tasks of a cluster must agree on, compared: versions, devices, clocks and shared storage."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping, Sequence

from tfdist.doctor.probe import format_table

#: Clocks further apart than this (seconds, after correcting for the round trip) are a problem.
MAX_CLOCK_OFFSET = 2.0

#: Report fields every task must agree on: field -> (how lines name it, the fix).
VERSIONS = {
    "python": ("Python", "run the same Python on every host"),
    "tensorflow": ("TensorFlow", "install the same TensorFlow on every host"),
    "keras": ("Keras", "install the same Keras on every host"),
    "tfdist": ("tfdist", "install the same tfdist on every host"),
}


class _Wire:
    """JSON in and out, for a dataclass sent between tasks (a JSON list comes back as a tuple)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]):
        """The value a peer sent (``TypeError``/``KeyError``/``AttributeError`` when it is not one)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in obj.items() if k in names})


@dataclasses.dataclass(frozen=True)
class Report(_Wire):
    """What one task says of itself.

    Attributes:
        task: ``type:index``.
        cluster: the cluster it was started with (TF_CONFIG's ``"cluster"`` form).
        python, tensorflow, keras, tfdist: versions ("" when not installed).
        gpus: how many GPUs it sees (None: not checked).
        model_dir: its ``--model_dir`` ("" when none was given: storage is not checked).
        token: what it wrote under ``model_dir`` for the others to read back.
    """

    task: str
    cluster: Mapping[str, Sequence[str]]
    python: str
    tensorflow: str
    keras: str
    tfdist: str
    gpus: int | None
    model_dir: str = ""
    token: str = ""


@dataclasses.dataclass(frozen=True)
class Observation(_Wire):
    """What one task found once it had every report.

    Attributes:
        task: ``type:index``.
        clock_offset: its clock minus the leader's, in seconds (0 on the leader; None: not measured).
        round_trip: the round trip of that measurement, in seconds.
        unseen: the tasks whose token it could not read back (or read another one) under its ``model_dir``.
        storage_error: why it could not write its own token ("" when it could).
    """

    task: str
    clock_offset: float | None = 0.0
    round_trip: float = 0.0
    unseen: tuple[str, ...] = ()
    storage_error: str = ""


def _names(tasks: Sequence[str]) -> str:
    return ", ".join(tasks)


def _has(tasks: Sequence[str]) -> str:
    return f"{_names(tasks)} {'has' if len(tasks) == 1 else 'have'}"


def disagreements(values: Mapping[str, object], leader: str, label: str) -> list[str]:
    """``"worker:1 has LABEL 2.20.0, the others 2.21.0"`` for each group of tasks off the common value.

    Args:
        values: task -> its value, in task order.
        leader: the task whose value wins a tie.
        label: how the value is named, e.g. ``"TensorFlow"``.
    """
    counts = collections.Counter(values.values())
    if len(counts) < 2:
        return []
    common = max(counts, key=lambda v: (counts[v], v == values.get(leader)))
    by_value: dict[object, list[str]] = {}
    for task, value in values.items():
        by_value.setdefault(value, []).append(task)
    lines = []
    for value, tasks in by_value.items():
        if value == common:
            continue
        rest = "the others" if len(counts) == 2 else _has(by_value[common])
        lines.append(" ".join(filter(None, (_has(tasks), label, f"{value},", rest, str(common)))))
    return lines


def compute_tasks(cluster: Mapping[str, Sequence[str]], *, coordinator: bool) -> list[str]:
    """The tasks that compute replicas, whose devices must agree: the workers, and the chief unless it coordinates."""
    names = [f"worker:{i}" for i in range(len(cluster.get("worker", ())))]
    return ([] if coordinator or "chief" not in cluster else ["chief:0"]) + names


def problems(reports: Mapping[str, Report], observations: Mapping[str, Observation], *, leader: str,
             compute: Sequence[str], max_clock_offset: float = MAX_CLOCK_OFFSET) -> list[str]:
    """One line per disagreement between the tasks, each naming the tasks and the fix.

    Args:
        reports: task -> its report, every task of the cluster.
        observations: task -> what it observed (a task missing here is not judged on clock or storage).
        leader: the leader's task name (its clock is the reference).
        compute: the tasks whose GPU counts must agree (``compute_tasks``).
        max_clock_offset: seconds of clock offset that are still fine.
    """
    lines = [f"{line}. Fix: hand every task the same cluster spec file (and --local to all or none)."
             for line in disagreements({t: _cluster_text(r.cluster) for t, r in reports.items()}, leader,
                                       "the cluster")]
    for field, (label, fix) in VERSIONS.items():
        values = {t: getattr(r, field) or "none" for t, r in reports.items()}
        lines += [f"{line}. Fix: {fix}." for line in disagreements(values, leader, label)]
    gpus = {t: _gpus(reports[t].gpus) for t in compute if t in reports and reports[t].gpus is not None}
    lines += [f"{line}. Fix: give every task that computes the same GPUs (CUDA_VISIBLE_DEVICES, the NVIDIA "
              "driver, tensorflow[and-cuda])." for line in disagreements(gpus, leader, "")]
    for task, seen in observations.items():
        offset = seen.clock_offset
        if offset is not None and abs(offset) > max_clock_offset:
            lines.append(f"{task}'s clock is {abs(offset):.1f} s {'ahead of' if offset > 0 else 'behind'} "
                         f"{leader}'s (the leader). Fix: run NTP (chrony, systemd-timesyncd) on every host.")
        if seen.storage_error:
            lines.append(f"{task} cannot write to --model_dir {reports[task].model_dir}: {seen.storage_error}. "
                         "Fix: give every task a writable --model_dir on shared storage.")
        elif seen.unseen:
            lines.append(
                f"{task} does not see what {_names(seen.unseen)} wrote to --model_dir: {task}'s "
                f"{reports[task].model_dir} is not the same storage as theirs "
                f"({_names(sorted({reports[t].model_dir for t in seen.unseen if t in reports}))}). Fix: give every "
                "task the same --model_dir on a file system they all share (NFS, a mounted bucket).")
    return lines


def _gpus(count: int) -> str:
    return f"{count} GPU{'' if count == 1 else 's'}"


def _cluster_text(cluster: Mapping[str, Sequence[str]]) -> str:
    return "{" + ", ".join(f"{t}: [{', '.join(a)}]" for t, a in cluster.items()) + "}"


def _storage(report: Report, seen: Observation | None) -> str:
    if not report.model_dir:
        return "not checked"
    if seen is None:
        return f"{report.model_dir} (?)"
    return f"{report.model_dir} ({'shared' if not seen.unseen and not seen.storage_error else 'NOT shared'})"


def _clock(task: str, leader: str, seen: Observation | None) -> str:
    if task == leader:
        return "leader"
    if seen is None or seen.clock_offset is None:
        return "?"
    return f"{round(seen.clock_offset, 3) + 0.0:+.3f} s"  # + 0.0: no "-0.000"


def table(reports: Mapping[str, Report], observations: Mapping[str, Observation], *, leader: str,
          addresses: Mapping[str, str]) -> list[str]:
    """One row per task: task, address, versions, GPUs, clock against the leader, storage."""
    rows = []
    for task, address in addresses.items():
        r, seen = reports.get(task), observations.get(task)
        if r is None:
            rows.append((task, address, "(never answered)", "", "", "", "", "", ""))
            continue
        rows.append((task, address, r.python, r.tensorflow or "none", r.keras or "none", r.tfdist or "none",
                     "?" if r.gpus is None else r.gpus, _clock(task, leader, seen), _storage(r, seen)))
    return format_table(("task", "address", "python", "tensorflow", "keras", "tfdist", "GPUs", "clock",
                         "model_dir"), rows)
