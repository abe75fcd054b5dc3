"""What ``tfdist.fit``'s client (``fitting.api.KerasClient``) builds once the task has started: the model from
``model_fn``, checked against its inputs and loss, its steps, and the eval pipeline.
"""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from tfdist import _compat
from tfdist.errors import UserError
from tfdist.fitting.custom_steps import KerasModelSteps, overrides_steps, refuse_under_coordinator
from tfdist.fitting.steps import KerasSteps
from tfdist.global_gradients import refuse_accumulation_under_coordinator


def build_model(model_fn, strategy_name: str, coordinator: bool, sample: tuple):
    """``(model, its optimizer or None)`` from ``model_fn``, checked and built; called under the strategy's scope.

    A model made without its input's shape (``Sequential([Dense(10)])``) is built on ``sample``'s ``x``, as
    Keras' fit builds it from its first batch: the optimizer is built next, with the model's variables.
    """
    import keras

    model = model_fn()
    own_steps = isinstance(model, keras.Model) and overrides_steps(model)
    if not isinstance(model, keras.Model) or (getattr(model, "optimizer", None) is None and not own_steps):
        raise UserError(f"Invalid model_fn: it must return a compiled keras.Model. Received: a "
                        f"{type(model).__name__} without an optimizer. Expected model.compile(optimizer=..., "
                        "loss=...) inside model_fn.")
    if not model.built:
        model(sample[0], training=False)
    if coordinator:
        refuse_under_coordinator(model, strategy_name)
        refuse_accumulation_under_coordinator(model.optimizer, strategy_name)
    return model, model.optimizer


def keras_steps(model, optimizer, sample, *, source, validation):
    """The model's ``Steps`` (``KerasModelSteps`` for a model's own steps, else ``KerasSteps``), once the model
    is checked to take the ``Source``s ``source`` (``sample``: its first rows) and ``validation`` (None: none)
    and, for compiled steps, its loss to take their targets.

    Raises:
        UserError: naming the input the model or its loss cannot take.
    """
    own_steps = bool(overrides_steps(model))
    # (what the targets are called, the first rows' targets, the model's outputs on their inputs)
    checked = [("y" if source.y is not None else "x", sample[1],
                _check_takes(model, sample, "x", batched_by_user=source.is_dataset))]
    if validation is not None:
        val_sample = validation.sample()
        checked.append(("validation_data", val_sample[1],
                        _check_takes(model, val_sample, "validation_data", batched_by_user=validation.is_dataset)))
    steps = (KerasModelSteps(model=model, sample=sample) if own_steps
             else KerasSteps(model=model, optimizer=optimizer, sample=sample))
    if not own_steps:
        for name, targets, predicted in checked:
            _check_loss(model, targets, predicted, name)
    return steps


def optimizer_settings(optimizer) -> dict:
    """What a resumed ``tfdist.fit`` run's optimizer must keep (``rundir.FIT_RESUME_KEYS``): its moving averages'
    momentum (0: none, as ``--ema_momentum``) and gradient accumulation (1: none); ``{}`` without an optimizer."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if inner is None:
        return {}
    ema = float(inner.ema_momentum) if getattr(inner, "use_ema", False) else 0.0
    return {"ema_momentum": ema,
            "gradient_accumulation_steps": int(getattr(inner, "gradient_accumulation_steps", None) or 1)}


def _first_line(error: Exception) -> str:
    """An error's first informative line, for a one-line message: not Keras' frame of which layer's call raised
    it ("Exception encountered when calling ..."), without its terminal colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith("Exception encountered when calling")]
    return " ".join((lines or [type(error).__name__])[0].split())[:200].rstrip(".")


def _check_takes(model, sample, name: str, *, batched_by_user: bool):
    """The model's outputs on ``sample``'s inputs; refuses an input the model cannot be called on (e.g. another
    width), before anything is written.

    ``batched_by_user``: the input is a Dataset, whose batches are the user's (the message says so).

    Raises:
        UserError: naming ``name`` (``x``, ``validation_data``) with the model's complaint.
    """
    try:
        with model.distribute_strategy.scope():
            return model(sample[0], training=False)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
        shapes = [tuple(t.shape) for t in tf.nest.flatten(sample[0])]
        hint = " (a Dataset must yield batches: dataset.batch(n))" if batched_by_user else ""
        raise UserError(f"Invalid `{name}` for this model: the model cannot take its examples{hint}. Received: "
                        f"inputs of shapes {shapes} (the first rows), and the model says: {_first_line(e)}. "
                        "Expected inputs of the shape the model was built for.") from None


def _check_loss(model, y, predicted, name: str) -> None:
    """Refuse targets ``y`` that the compiled loss cannot compare with the model's outputs ``predicted`` on the
    same rows, before anything is written; under a ``StatelessScope``, so that the loss trackers keep their state.

    Raises:
        UserError: naming ``name`` (``y``, ``validation_data``) with the loss's complaint.
    """
    import keras

    try:
        with model.distribute_strategy.scope(), keras.StatelessScope():
            _compat.compiled_loss(model)(y, predicted)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as e:
        shapes = [tuple(t.shape) for t in tf.nest.flatten(y)]
        raise UserError(f"Invalid `{name}` for this model's loss: it cannot compare the targets with the model's "
                        f"outputs. Received: targets of shapes {shapes} (the first rows), and the loss says: "
                        f"{_first_line(e)}. Expected targets of the shape the compiled loss takes.") from None


def learning_rate(optimizer) -> float:
    """The optimizer's learning rate now (NaN for a model without one: its own steps hold their optimizers)."""
    return float(np.asarray(optimizer.learning_rate)) if optimizer is not None else float("nan")
