"""``tfdist.fit``'s model, as its client (``fitting.api.KerasClient``) builds it once the task has started: the model
from ``model_fn``, checked against its inputs and loss, and its steps.
"""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from tfdist import _compat
from tfdist.errors import UserError
from tfdist.fitting.custom_steps import KerasModelSteps, overrides_steps, refuse_under_coordinator
from tfdist.fitting.steps import KerasSteps
from tfdist.one_device.symbolic import has_call, keras_tensors, zeros
from tfdist.one_device.optimizer import refuse_accumulation_under_coordinator


def build_model(model_fn, strategy_name: str, coordinator: bool, spec):
    """``(model, its optimizer or None)`` from ``model_fn``, checked and built; called under the strategy's scope.

    A model made without its input's shape (``Sequential([Dense(10)])``) is built from ``spec``, the type of
    its data (``inputs.Source.spec``), as Keras' symbolic build builds it; one without a ``call`` (its own
    ``train_step`` calls its parts) from what its ``train_step`` creates (``symbolic.build``).
    """
    import keras

    from tfdist.one_device import symbolic

    model = model_fn()
    own_steps = isinstance(model, keras.Model) and overrides_steps(model)
    if not isinstance(model, keras.Model) or (getattr(model, "optimizer", None) is None and not own_steps):
        raise UserError(f"Invalid model_fn: it must return a compiled keras.Model. Received: a "
                        f"{type(model).__name__} without an optimizer. Expected model.compile(optimizer=..., "
                        "loss=...) inside model_fn.")
    if not symbolic.has_call(model):
        symbolic.trace_train_step(model, spec)  # its variables exist before a checkpoint is restored into them
    elif not model.built:
        _compat.output_spec(model, symbolic.keras_tensors(keras.utils.unpack_x_y_sample_weight(spec)[0]),
                            training=False)
    if coordinator:
        refuse_under_coordinator(model, strategy_name)
        refuse_accumulation_under_coordinator(model.optimizer, strategy_name)
    return model, model.optimizer


def keras_steps(model, optimizer, spec, *, source, validation):
    """The model's ``Steps`` (``KerasModelSteps`` for a model's own steps, else ``KerasSteps``), once the model
    is checked to take the ``Source``s ``source`` (``spec``: the type of its batches) and ``validation`` (None:
    none) and, for compiled steps, its loss to take their targets; symbolically, from the inputs' types.

    Raises:
        UserError: naming the input the model or its loss cannot take.
    """
    own_steps = bool(overrides_steps(model))
    inputs = [("x", source, spec)] + ([] if validation is None else
                                      [("validation_data", validation, validation.spec())])
    checked = []  # (what the targets are called, the targets, the model's outputs on their inputs)
    for name, input_source, input_spec in inputs:
        x, y, _ = _unpack(input_spec)
        if own_steps and not has_call(model):
            continue  # its train_step calls its parts: it was built from it (build_model)
        if y is None and not own_steps:
            _refuse_no_targets(name, input_source)
        rows = input_source.first_rows()  # numpy rows: checked on values; a dataset: on its type
        if rows is not None:
            x, y = rows
        predicted = _check_takes(model, x, name, batched_by_user=input_source.is_dataset)
        checked.append(("y" if name == "x" and source.y is not None else name, y, predicted))
    if own_steps:
        return KerasModelSteps(model=model, spec=spec, takes_tuples={"train_step": isinstance(spec, tuple),
                                                                     "test_step": isinstance(inputs[-1][2], tuple)})
    rows = source.first_rows()
    if rows is None:  # a dataset's targets are checked on their type, before its loss is built on zeros of it
        for name, targets, predicted in checked:
            _check_loss(model, targets, predicted, name)
    # Built on numpy rows, or on zeros of a dataset's type (symbolically where that is not known).
    steps = KerasSteps(model=model, optimizer=optimizer, spec=spec, rows=rows or zeros(_unpack(spec)[:2]))
    if rows is not None:
        for name, targets, predicted in checked:
            _check_loss(model, targets, predicted, name)
    return steps


def _unpack(spec) -> tuple:
    """``(x, y, sample_weight)`` of a batch's type as Keras unpacks a batch (None where absent)."""
    import keras

    return keras.utils.unpack_x_y_sample_weight(spec)


def _refuse_no_targets(name: str, source) -> None:
    """Refuse an input without targets for a compiled loss, which compares targets with the model's outputs (Keras'
    ``fit`` fails on it too).

    Raises:
        UserError: naming ``name`` and the input's kind.
    """
    kind = ("numpy x without y" if source.is_arrays else
            "a tf.data.Dataset of inputs alone (no (x, y) tuples)" if source.is_dataset else
            "a dataset_fn whose Dataset yields inputs alone (no (x, y) tuples)")
    raise UserError(f"Missing `y` for this model's compiled loss: it compares targets with the model's outputs. "
                    f"Received: `{name}` as {kind}. Expected the targets (y=..., or a Dataset of (x, y) batches), "
                    "or a model whose own train_step takes its inputs alone.")


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
    it ("Exception encountered when calling ..."), without its terminal colours nor the name TensorFlow gives the
    op's function ("{{function_node __wrapped__Sub_device_...}}") and op ("[Op:Sub] name:")."""
    text = re.sub(r"\x1b\[[0-9;]*m|\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\]( name:[^\n]*)?", "",
                  str(error))
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith("Exception encountered when calling")]
    return " ".join((lines or [type(error).__name__])[0].split())[:200].rstrip(".")


def _check_takes(model, x, name: str, *, batched_by_user: bool):
    """The model's outputs on ``x``: numpy rows (called on them), or the type of a dataset's inputs (its
    ``keras.KerasTensor`` outputs, computed symbolically: the dataset is not read); refuses an input the model
    cannot be called on (e.g. another width), before anything is written.

    ``batched_by_user``: the input is a Dataset, whose batches are the user's (the message says so).

    Raises:
        UserError: naming ``name`` (``x``, ``validation_data``) with the model's complaint.
    """
    try:
        with model.distribute_strategy.scope():
            if _typed(x):
                return _compat.output_spec(model, keras_tensors(x), training=False)
            return model(x, training=False)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
        hint = " (a Dataset must yield batches: dataset.batch(n))" if batched_by_user else ""
        raise UserError(f"Invalid `{name}` for this model: the model cannot take its examples{hint}. Received: "
                        f"inputs of shapes {_shapes(x)}, and the model says: {_first_line(e)}. Expected inputs "
                        "of the shape the model was built for.") from None


def _check_loss(model, y, predicted, name: str) -> None:
    """Refuse targets ``y`` (numpy rows, or a dataset's type) that the compiled loss cannot compare with the
    model's outputs ``predicted`` on them, before anything is written; with nothing assigned (a
    ``StatelessScope``, or symbolically), so that the loss trackers keep their state.

    Raises:
        UserError: naming ``name`` (``y``, ``validation_data``) with the loss's complaint.
    """
    import keras

    loss = _compat.compiled_loss(model)
    try:
        with model.distribute_strategy.scope():
            if _typed(y):
                _compat.output_spec(loss, keras_tensors(y), predicted)
            else:
                with keras.StatelessScope():
                    for rows in (y, predicted), _three_rows(y, predicted):
                        loss(*rows)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as e:
        raise UserError(f"Invalid `{name}` for this model's loss: it cannot compare the targets with the model's "
                        f"outputs. Received: targets of shapes {_shapes(y)}, and the loss says: {_first_line(e)}. "
                        "Expected targets of the shape the compiled loss takes.") from None


def _three_rows(y, predicted) -> tuple:
    """Numpy targets and outputs of a few rows as three rows: a target's dimension that broadcasts against the
    outputs' rows on two rows but not on three (a target of shape (rows, 2, 2) for outputs (rows, 1)) fails on
    one of the two counts, as it fails on a batch of any other size in training."""
    count = len(tf.nest.flatten(predicted)[0])
    pick = [i % count for i in range(3)]
    return (tf.nest.map_structure(lambda a: None if a is None else np.asarray(a)[pick], y),
            tf.nest.map_structure(lambda t: tf.gather(t, pick), predicted))


def _typed(value) -> bool:
    """Whether ``value`` is the type of a dataset's part (``tf.TensorSpec``s), not numpy rows."""
    return any(isinstance(part, tf.TypeSpec) for part in tf.nest.flatten(value))


def _shapes(value) -> str:
    """The shapes of numpy rows (``(the first rows)``) or of a dataset's type (``None``: any number of rows)."""
    shapes = [tuple(t.shape) for t in tf.nest.flatten(value)]
    return f"{shapes} ({'None: any number of rows' if _typed(value) else 'the first rows'})"


def learning_rate(optimizer) -> float:
    """The optimizer's learning rate now (NaN for a model without one: its own steps hold their optimizers)."""
    return float(np.asarray(optimizer.learning_rate)) if optimizer is not None else float("nan")
