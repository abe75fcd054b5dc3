"""A trained case against one device: how far each part of it lies, and its class (equal, refused, differs,
crashed; ``trained`` for an asynchronous mode; ``timeout`` for one stopped by ``--timeout``), with the tolerance
derived from the noise floor.
"""

from __future__ import annotations

import math

import numpy as np

#: The classes of a verdict, and those that fail a run of the check.
CLASSES = ("equal", "trained", "refused", "differs", "crashed", "timeout")
FAILING = ("differs", "crashed", "timeout")

#: A difference counts as equal up to ``FLOOR_FACTOR`` times the float32 noise floor of this process's
#: replicas (the control case's largest difference from one device), and never below ``MINIMUM``.
FLOOR_FACTOR, MINIMUM = 100.0, 1e-6


def _relative(a: float, b: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return abs(a - b) / max(abs(b), 1e-3)


def _arrays(got: list, want: list) -> float:
    """The largest relative L2 difference between two lists of arrays (inf when their shapes differ)."""
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for u, v in zip(got, want):
        u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
        if u.shape != v.shape:
            return math.inf
        worst = max(worst, float(np.linalg.norm(u - v) / max(np.linalg.norm(v), 1e-6)))
    return worst


def _series(got: dict, want: dict) -> tuple[float, str]:
    """The largest relative difference of the entries ``want`` has (inf for one missing), and its key."""
    worst, where = 0.0, ""
    for key, values in want.items():
        other = got.get(key)
        if other is None or np.shape(other) != np.shape(values):
            return math.inf, f"{key} (missing or another length: {other!r})"
        for a, b in zip(np.ravel(other), np.ravel(values)):
            d = _relative(float(a), float(b))
            if d > worst or math.isnan(d):
                worst, where = (math.inf if math.isnan(d) else d), key
    return worst, where


def _files(got: dict, want: dict) -> tuple[float, str]:
    """How far the files a run's callbacks wrote lie from one device's: inf for another set of files or another
    count of event files, else the largest relative difference of their CSV numbers."""
    if set(got) != set(want):
        return math.inf, f"files {sorted(got)} vs {sorted(want)}"
    worst, where = 0.0, ""
    for path, written in want.items():
        if isinstance(written, dict):
            other = got[path]
            if not isinstance(other, dict) or other["columns"] != written["columns"]:
                return math.inf, f"{path}: columns {other!r} vs {written['columns']}"
            got_rows, want_rows = np.asarray(other["rows"], np.float64), np.asarray(written["rows"], np.float64)
            if got_rows.shape != want_rows.shape or not np.array_equal(np.isnan(got_rows), np.isnan(want_rows)):
                return math.inf, f"{path}: {other['rows']} vs {written['rows']}"
            found = _arrays([np.nan_to_num(got_rows)], [np.nan_to_num(want_rows)])  # a column left NA on both
            worst, where = max((worst, where), (found, path))
        elif got[path] != written:
            return math.inf, f"{path}: {got[path]} written vs {written}"
    return worst, where


def differences(got: dict, want: dict) -> dict[str, tuple[float, str]]:
    """``{part: (largest relative difference, where)}`` of a trained case against one device's."""
    return {
        "files": _files(got.get("files", {}), want.get("files", {})),
        "history": _series(got["history"], want["history"]),
        "weights": (_arrays(got["weights"], want["weights"]), ""),
        "optimizer": (max(_relative(got["learning_rate"], want["learning_rate"]),
                          0.0 if got["iterations"] == want["iterations"] else math.inf),
                      f"learning_rate {got['learning_rate']:.6g} vs {want['learning_rate']:.6g}, "
                      f"iterations {got['iterations']} vs {want['iterations']}"),
        "copies": (got["copies"], "replicas' copies of a variable"),
        "evaluate": _series(got["evaluate"], want["evaluate"]),
        "predict": (_arrays(got["predict"], want["predict"]), ""),
    }


def tolerance(floor: float) -> float:
    """The largest difference that counts as equal, given the noise floor measured in the same process."""
    return max(MINIMUM, FLOOR_FACTOR * floor)


def noise_floor(got: dict, want: dict) -> float:
    """The control case's largest difference from one device: the float32 noise of this process's replicas."""
    return max(d for d, _ in differences(got, want).values())


def verdict(got: dict, want: dict, *, tol: float, asynchronous: bool = False) -> dict:
    """``{"class", "detail", "differences"}`` of one mode's result of a case against one device's."""
    if "refused" in got:
        return {"class": "refused", "detail": got["refused"]}
    if "crashed" in got:
        return {"class": "crashed", "detail": got["crashed"]}
    found = differences(got, want)
    summary = {part: d for part, (d, _) in found.items()}
    if asynchronous:
        trained = all(math.isfinite(v) for values in got["history"].values() for v in values)
        return {"class": "trained" if trained else "differs", "differences": summary,
                "detail": "" if trained else "a History value is not finite"}
    part, (worst, where) = max(found.items(), key=lambda item: item[1][0])
    if worst <= tol:
        return {"class": "equal", "differences": summary, "detail": ""}
    return {"class": "differs", "differences": summary,
            "detail": f"{part} {worst:.3g} > {tol:.3g}" + (f" ({where})" if where else "")}
