"""The training half of ``tfdist.fit``, once the strategy exists: model, inputs, callbacks, the one loop.

``train_keras`` builds the user's model under the strategy's scope, restores
the run directory's latest checkpoint (model, optimizer, step), cuts the
inputs into per-replica slices (``keras_data``), and trains with
``KerasSteps`` through ``drive`` (watchdog, loop, ``Controller``): a log row
and a checkpoint per epoch, the validation pass after each. At each epoch's
end every task adds the epoch's logs to its ``History`` and the chief runs
the callbacks; ``model.stop_training`` set by one of them stops every task.
"""

from __future__ import annotations

import shutil

import numpy as np
import tensorflow as tf

from tfdist.errors import UserError
from tfdist.training.checkpoints import Checkpoints
from tfdist.training.drive import drive
from tfdist.training.keras_data import check_batch, dataset_fns, rows_and_steps
from tfdist.training.keras_steps import KerasSteps
from tfdist.training.outputs import RunOutputs

#: Keys of a train or eval result that are not Keras logs.
NOT_LOGGED = ("examples", "images_per_second", "learning_rate")


def _sample(x, y):
    """A couple of examples ``(x, y)`` to build the compiled metrics with, from any kind of input."""
    if isinstance(x, tf.data.Dataset):
        xb, yb = next(iter(x.take(1)))
        return tf.nest.map_structure(lambda t: t[:2], xb), tf.nest.map_structure(lambda t: t[:2], yb)
    if callable(x):
        xb, yb = next(iter(x(tf.distribute.InputContext()).take(1)))
        return tf.nest.map_structure(lambda t: t[:2], xb), tf.nest.map_structure(lambda t: t[:2], yb)
    return tf.nest.map_structure(lambda a: np.asarray(a)[:2], x), tf.nest.map_structure(lambda a: np.asarray(a)[:2], y)


def _logs(train: dict | None, evaluated: dict | None) -> dict:
    """Keras' epoch logs: the train metrics, and the eval ones as ``val_*``."""
    logs = {k: v for k, v in (train or {}).items() if k not in NOT_LOGGED}
    logs.update({f"val_{k}": v for k, v in (evaluated or {}).items() if k not in NOT_LOGGED})
    return logs


def _warn_unsynchronized_batch_norm(model, replicas: int) -> None:
    """With several replicas, a ``BatchNormalization(synchronized=False)`` differs from one device: say so once."""
    import keras
    from absl import logging

    from tfdist.models import ReplicaBatchNorm

    if replicas < 2:
        return
    layers = [layer.name for layer in model._flatten_layers(include_self=False)
              if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized
              and not isinstance(layer, ReplicaBatchNorm)]  # it all-reduces its statistics itself
    if layers:
        logging.warning(
            "%d replicas and batch norm without synchronized=True (%s): each replica normalizes its own slice "
            "of the global batch, so training differs from one device. "
            "keras.layers.BatchNormalization(synchronized=True) all-reduces the statistics.",
            replicas, ", ".join(layers))


def train_keras(model_fn, x, y, *, runtime, task, run_dir, strategy, preemption, batch_size, epochs,
                validation_data, steps_per_epoch, validation_steps, shuffle, initial_epoch, callbacks, verbose,
                seed, keep_checkpoints: bool):
    """Train under ``strategy``; returns the ``keras.callbacks.History`` (see ``tfdist.fit`` for the arguments)."""
    import keras

    from tfdist import strategies

    coordinator = strategies.traits(runtime.strategy).coordinator
    is_chief = task is None or task.is_leader
    replicas = strategy.num_replicas_in_sync
    if batch_size is None and not isinstance(x, tf.data.Dataset):
        raise UserError("Missing `batch_size`. Received: batch_size=None. Expected the global batch, e.g. 64.")
    if batch_size is not None:
        check_batch(batch_size, replicas)
    with strategy.scope():
        model = model_fn()
        if not isinstance(model, keras.Model) or getattr(model, "optimizer", None) is None:
            raise UserError(f"Invalid model_fn: it must return a compiled keras.Model. Received: a "
                            f"{type(model).__name__} without an optimizer. Expected model.compile(optimizer=..., "
                            "loss=...) inside model_fn.")
        optimizer = model.optimizer
        optimizer.build(model.trainable_variables)
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    _warn_unsynchronized_batch_norm(model, replicas)
    steps = KerasSteps(model=model, optimizer=optimizer, sample=_sample(x, y))
    checkpoints = Checkpoints(checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_counter),
                              run_dir=run_dir, is_chief=is_chief, task=task.name if task else "local")
    restored = checkpoints.restore_latest()
    epoch_steps = steps_per_epoch or rows_and_steps(x, y, batch_size)[1]
    if not epoch_steps:
        raise UserError("Missing `steps_per_epoch`. Received: an input of unknown length. Expected "
                        "steps_per_epoch=N with a dataset_fn or a Dataset that repeats.")
    eval_fn = None
    if validation_data is not None:
        vx, vy = (validation_data, None) if isinstance(validation_data, tf.data.Dataset) else validation_data
        eval_fn, _ = dataset_fns(vx, vy, batch_size=batch_size, shuffle=False, seed=seed, training=False)
        if validation_steps:
            eval_fn = (lambda base: lambda context: base(context).take(validation_steps * max(
                1, context.num_replicas_in_sync // context.num_input_pipelines)))(eval_fn)

    if not restored and initial_epoch:
        step_counter.assign(initial_epoch * epoch_steps)
    start_step, total_steps = int(step_counter.numpy()), epochs * epoch_steps
    train_fn, _ = dataset_fns(x, y, batch_size=batch_size, shuffle=shuffle, seed=seed, training=True,
                              start_step=start_step, own_order_per_worker=coordinator,
                              stage_dir=run_dir.fit_inputs if coordinator else None)
    outputs = RunOutputs(run_dir=run_dir, is_chief=is_chief)

    history = keras.callbacks.History()
    history.set_model(model)
    params = {"verbose": verbose, "epochs": epochs, "steps": epoch_steps}
    history.set_params(params)
    chief_callbacks = keras.callbacks.CallbackList(callbacks if is_chief else None, add_history=False,
                                                   add_progbar=False, model=model, **params)
    history.on_train_begin()
    chief_callbacks.on_train_begin()
    chief_callbacks.on_epoch_begin(start_step // epoch_steps)

    def epoch_end(step, train, evaluated) -> bool:
        epoch, logs = step // epoch_steps - 1, _logs(train, evaluated)
        history.on_epoch_end(epoch, logs)
        chief_callbacks.on_epoch_end(epoch, logs)
        stop = bool(getattr(model, "stop_training", False))
        if not stop and step < total_steps:
            chief_callbacks.on_epoch_begin(epoch + 1)
        return stop

    if verbose and is_chief:
        where = f"resuming from {restored} at step {start_step}" if restored else f"starting at step {start_step}"
        print(f"tfdist.fit: {runtime.strategy} with {replicas} replicas, global batch {batch_size}, "
              f"{total_steps} steps ({epoch_steps} an epoch); {where}", flush=True)
    drive(runtime=runtime, task=task, run_dir=run_dir, strategy=strategy, steps=steps, step_counter=step_counter,
          checkpoints=checkpoints if keep_checkpoints else None, outputs=outputs, start_step=start_step,
          total_steps=total_steps, train_dataset_fn=train_fn, eval_dataset_fn=eval_fn, preemption=preemption,
          global_batch_size=batch_size or 0, steps_per_epoch=epoch_steps,
          steps_per_loop=max(1, int(getattr(model, "steps_per_execution", 1) or 1)), log_every=epoch_steps,
          checkpoint_every=epoch_steps, learning_rate=lambda _: float(np.asarray(optimizer.learning_rate)),
          verbose=bool(verbose) and is_chief, epoch_end=epoch_end)
    if not keep_checkpoints:
        checkpoints.close()
    chief_callbacks.on_train_end()
    if coordinator:
        shutil.rmtree(run_dir.fit_inputs, ignore_errors=True)
    return history
