"""The training half of ``tfdist.fit`` once the task has started: the model, the inputs, the callbacks and
the engine task.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import tensorflow as tf

from tfdist import _compat
from tfdist.config import check_total_steps
from tfdist.engine.controller import Schedule
from tfdist.engine.outputs import RunOutputs
from tfdist.engine.state import build_state
from tfdist.engine.task import Task
from tfdist.errors import UserError
from tfdist.fitting.args import evaluates_after
from tfdist.fitting.batch_norm import warn_unsynchronized_batch_norm
from tfdist.fitting.callbacks import KerasCallbacks, chief_only_files, implements_batch_hooks
from tfdist.fitting.custom_steps import KerasModelSteps, overrides_steps, refuse_under_coordinator
from tfdist.fitting.inputs import check_batch
from tfdist.global_gradients import refuse_accumulation_under_coordinator
from tfdist.fitting.steps import KerasSteps
from tfdist.runtime.run_loop import run_loop


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


def train_keras(model_fn, source, validation, *, training, batch_size, epochs, validation_freq=1, steps_per_epoch,
                validation_steps, shuffle, initial_epoch, callbacks, verbose, seed, keep_checkpoints: bool,
                class_weight=None):
    """Train under ``training.strategy``; returns the ``keras.callbacks.History`` (see ``tfdist.fit``)."""
    import keras

    from tfdist import global_gradients

    global_gradients.install()  # the optimizer applies the global batch's gradient, as on one device
    placement, run_dir = training.placement, training.run_dir
    strategy, is_chief, coordinator = training.strategy, placement.is_chief, placement.coordinator
    replicas = strategy.num_replicas_in_sync
    if batch_size is not None:
        check_batch(batch_size, replicas)
    sample = source.sample()
    state = build_state(strategy, lambda: build_model(model_fn, placement.strategy, coordinator, sample),
                        run_dir=run_dir, is_chief=is_chief, task=placement.name)
    model, optimizer, step_counter = state.model, state.optimizer, state.step
    settings = {"batch_size": batch_size, **_optimizer_settings(optimizer)}
    run_dir.check_fit_settings(settings)
    warn_unsynchronized_batch_norm(model, replicas)
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
    epoch_steps = steps_per_epoch or source.rows_and_steps(batch_size)[1]  # an input of unknown length: refused before
    check_total_steps(epochs, epoch_steps, epochs_name="epochs", steps_name="steps_per_epoch")
    eval_fn = None if validation is None else validation.eval_dataset_fn(
        batch_size=batch_size, validation_steps=validation_steps, seed=seed)
    if not state.restored and initial_epoch:
        step_counter.assign(initial_epoch * epoch_steps)
    start_step, total_steps = int(step_counter.numpy()), epochs * epoch_steps
    # Every check is done: the run directory's first write.
    if is_chief and keep_checkpoints:
        run_dir.write_fit_record(settings)
    train_fn, _ = source.dataset_fns(class_weight=class_weight, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                     training=True, start_step=start_step, own_order_per_worker=coordinator,
                                     stage_dir=run_dir.fit_inputs if coordinator else None, total_steps=total_steps)
    outputs = RunOutputs(run_dir=run_dir, is_chief=is_chief)

    params = {"verbose": verbose, "epochs": epochs, "steps": epoch_steps}
    # Every task that runs this loop runs the callbacks, with the same global logs, so that what they change
    # (the learning rate, the weights, stop_training) changes alike on every worker; their files are the chief's.
    # The History comes last, as in Keras' fit: it records what the callbacks add to the logs (learning_rate).
    history = keras.callbacks.History()
    callback_list = keras.callbacks.CallbackList([*(callbacks or []), history], add_history=False,
                                                 add_progbar=False, model=model, **params)
    reset = steps.reset if own_steps else (lambda: None)  # a model's own metrics: reset as Keras' fit does
    reset()
    per_execution = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    keras_callbacks = KerasCallbacks(
        model=model, callbacks=callback_list, reset=reset, epoch_steps=epoch_steps,
        total_steps=total_steps, per_execution=per_execution, eval_reset=own_steps,
        batch_hooks=any(implements_batch_hooks(c) for c in callbacks or []))  # only when a callback has them
    if verbose and is_chief:
        print(f"tfdist.fit: {placement.strategy} with {replicas} replicas, global batch {batch_size}, "
              f"{total_steps} steps ({epoch_steps} an epoch); {state.start()}", flush=True)
    task = Task(steps=steps, train_dataset_fn=train_fn, eval_dataset_fn=eval_fn,
                learning_rate=lambda _: _learning_rate(optimizer), global_batch_size=batch_size or 0,
                hooks=(keras_callbacks,))
    with chief_only_files(callbacks or [], placement):
        callback_list.on_train_begin()
        callback_list.on_epoch_begin(start_step // epoch_steps)
        run_loop(training, state, task,
                 Schedule(total_steps=total_steps, steps_per_epoch=epoch_steps, steps_per_loop=per_execution,
                          log_every=epoch_steps, checkpoint_every=epoch_steps,
                          evaluates_after=lambda epoch: evaluates_after(epoch, validation_freq)),
                 outputs=outputs, checkpoints=keep_checkpoints, verbose=bool(verbose) and is_chief)
        if epochs > 0:
            state.finalize_ema()  # the EMA weights into the model, as Keras' fit leaves them
        callback_list.on_train_end()
    if coordinator:
        shutil.rmtree(run_dir.fit_inputs, ignore_errors=True)
    return history


def _optimizer_settings(optimizer) -> dict:
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
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as e:
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


def _learning_rate(optimizer) -> float:
    """The optimizer's learning rate now (NaN for a model without one: its own steps hold their optimizers)."""
    return float(np.asarray(optimizer.learning_rate)) if optimizer is not None else float("nan")
