"""One case trained in one mode, and what the check compares of it: the History, the final weights, the
optimizer's state, every replica's copy of each variable, ``evaluate`` and ``predict`` afterwards.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile

import numpy as np



@dataclasses.dataclass(frozen=True)
class Mode:
    """What a mode trains with: ``tfdist.fit`` under a strategy's name, or Keras' own ``fit`` under a strategy;
    the group of processes it runs in (a process is set up for one kind of strategy); whether it runs more
    than one replica, and whether its workers apply their steps asynchronously (the math allows a run that
    trains there, not one device's numbers)."""

    how: str
    strategy: str
    group: str
    replicated: bool = True
    asynchronous: bool = False


MODES = {
    "one_device": Mode("tfdist", "one_device", "local", replicated=False),
    "mirrored": Mode("tfdist", "mirrored", "local"),
    "central_storage": Mode("tfdist", "central_storage", "local"),
    "keras_mirrored": Mode("keras", "mirrored", "local"),
    "multi_worker_mirrored": Mode("tfdist", "multi_worker_mirrored", "workers"),
    "keras_multi_worker_mirrored": Mode("keras", "multi_worker_mirrored", "workers"),
    "parameter_server": Mode("tfdist", "parameter_server", "coordinator", asynchronous=True),
}


def _float(value) -> float:
    return float(np.asarray(value, dtype=np.float64))


def files(directory: str | None) -> dict:
    """What a run's callbacks wrote under ``directory``: ``{path: count}`` (TensorBoard's event files, named after
    their host and time, counted under one name), a CSV file as its rows of numbers."""
    found = {}
    if directory is None or not os.path.isdir(directory):
        return found
    for folder, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, directory)
            if name.startswith("events.out.tfevents."):
                key = os.path.join(os.path.dirname(relative), "events.out.tfevents.*")
                found[key] = found.get(key, 0) + 1
            elif name.endswith(".csv"):
                with open(path, encoding="utf-8") as f:
                    rows = [line.strip().split(",") for line in f if line.strip()]
                found[relative] = {"columns": rows[0] if rows else [],
                                   "rows": [[float("nan") if v == "NA" else float(v) for v in row] for row in rows[1:]]}
            else:
                found[relative] = 1
    return found


def outcome(model, history) -> dict:
    """What the check compares of a trained model and its History (numbers only, JSON-ready but the arrays)."""
    import keras
    import tensorflow as tf

    optimizer = model.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    strategy = model.distribute_strategy
    copies = 0.0
    for variable in model.weights:
        local = [np.asarray(v) for v in strategy.experimental_local_results(variable.value)]
        copies = max([copies] + [float(np.max(np.abs(c - local[0]))) if c.size else 0.0 for c in local[1:]])
    return {
        "history": {k: [np.asarray(v, dtype=np.float64).tolist() for v in values]  # a metric may be an array
                    for k, values in history.history.items()},
        "weights": [np.asarray(w) for w in model.get_weights()],
        "learning_rate": _float(keras.ops.convert_to_numpy(inner.learning_rate)),
        "iterations": int(np.asarray(inner.iterations)),
        "copies": copies,
        "tf": tf.__version__,
    }


def after_training(setup, model) -> dict:
    """``evaluate`` (every metric) and ``predict`` of the trained model on the setup's held-out rows (a setup's
    own ``after_training`` for a model without ``call()``)."""
    own = getattr(setup, "after_training", None)
    made = own(model) if own is not None else None
    if made is not None:
        return made
    x, y, batch = setup.held_out()
    evaluated = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    predicted = model.predict(x, batch_size=batch, verbose=0)
    return {"evaluate": {k: np.asarray(v, dtype=np.float64).tolist() for k, v in evaluated.items()},
            "predict": [np.asarray(p, dtype=np.float32) for p in
                        (predicted.values() if isinstance(predicted, dict) else [predicted])]}


def _fits(setup, directory: str | None, fit) -> tuple:
    """``(model, History)`` of a setup's last ``fit`` (``fit(x, y, kwargs) -> (model, History)``), after each
    earlier attempt of a resumed setup (``setup.attempts``) stopped by the exception it plants."""
    from tfdist.check.build import Interrupted

    drawn = hasattr(setup, "attempts")  # a user's setup takes no directory and fits once
    attempts = setup.attempts if drawn else 1
    for attempt in range(attempts):
        x, y, kwargs = setup.fit_arguments(directory, attempt) if drawn else setup.fit_arguments()
        if attempt + 1 == attempts:
            return fit(x, y, kwargs)
        try:
            fit(x, y, kwargs)
        except Interrupted:
            continue
        raise RuntimeError("the first fit of a resumed case was not stopped by its interruption")
    raise RuntimeError("a setup with no fit")


def directory_for(root: str | None, seed: int, run: str) -> str:
    """Where run ``run`` (a mode, or ``reference-<task>``) of case ``seed`` writes its callbacks' files: under
    ``root``, which every worker of a cluster shares (None: a new temporary folder of this process)."""
    directory = os.path.join(root or tempfile.mkdtemp(prefix="tfdist-check-"), str(seed), run)
    os.makedirs(directory, exist_ok=True)
    return directory


def reference(setup, *, directory: str | None = None) -> dict:
    """Keras' own ``model.fit`` of a setup without a strategy: one device with the global batch.

    A setup (``build.Drawn``, ``user.UserSetup``) gives ``model_fn()``, ``fit_arguments() -> (x, y, kwargs)``
    and ``held_out() -> (x, y, batch)``; a drawn one also ``attempts`` and ``fit_arguments(directory, attempt)``.
    """
    def fit(x, y, kwargs):
        model = setup.model_fn()()
        return model, model.fit(x, y, **kwargs)

    model, history = _fits(setup, directory, fit)
    return {**outcome(model, history), **after_training(setup, model), "files": files(directory)}


@functools.cache
def _keras_strategy(mode: Mode):
    """The one strategy of Keras' own ``fit`` in this process, made once for every case of the process:
    ``tfdist.setup``'s across workers, two logical CPUs in one process."""
    import tensorflow as tf

    import tfdist

    if mode.group == "workers":
        return tfdist.setup(mode.strategy)  # the process' own set-up, called again with the same arguments
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def train(setup, mode: str, *, cluster_resolver=None, directory: str | None = None) -> dict:
    """A setup trained in ``mode``: its outcome, ``{"refused": line}`` or ``{"crashed": what}``; its callbacks
    write under ``directory`` (every worker the same one)."""
    import tfdist
    from tfdist.errors import UserError

    how = MODES[mode]

    def fit(x, y, kwargs):
        if how.how == "tfdist":
            extra = {"cluster_resolver": cluster_resolver} if cluster_resolver is not None else {}
            named = None if how.group == "workers" else how.strategy  # across workers: the set-up's own
            history = tfdist.fit(setup.model_fn(), x, y, strategy=named, **kwargs, **extra)
            return history.model, history
        with _keras_strategy(how).scope():
            model = setup.model_fn()()
        return model, model.fit(x, y, **kwargs)

    try:
        model, history = _fits(setup, directory, fit)
        return {**outcome(model, history), **after_training(setup, model), "files": files(directory)}
    except UserError as error:
        return {"refused": str(error)}
    except Exception as error:  # noqa: BLE001 - a crash is a verdict of the check, with its type and cause
        return {"crashed": crash_line(error)}


def crash_line(error: BaseException) -> str:
    """An exception in one line: its type and the line that says what went wrong (TensorFlow's root error)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^(\(\d+\) )?[A-Z][A-Z_]+: ", line)]
    causes += [before for before, line in zip(lines, lines[1:]) if line.startswith("[[")]  # a graph's op error
    if lines and lines[0] == "in user code:":  # a traced function's error: its own message ends the text
        causes.append(lines[-1])
    text = causes[0] if causes else (lines[0] if lines else "")
    return f"{type(error).__name__}: {text[:300]}"

