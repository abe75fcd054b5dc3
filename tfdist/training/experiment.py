"""``run(config)``: one experiment, config -> cluster task -> strategy -> data -> model -> loop -> outputs.

The library behind ``python -m tfdist.train``, in a fixed order: everything the
user gave is checked before anything is written or TensorFlow starts (a bad run
never damages ``model_dir``); TF_CONFIG and devices are set before TensorFlow
starts and the strategy is made before any other op (DESIGN.md); model,
optimizer and step counter are built in the strategy's scope, restored and
trained; the chief writes the outputs. A task's type picks its role first
(``roles``). ``weights_dir`` has every training task write its final weights
(``--dump_weights``). See docs/notes-from-docstrings.md (Running).
"""

from __future__ import annotations

import time
from pathlib import Path

from tfdist import config as config_lib
from tfdist import strategies
from tfdist.cluster import peers
from tfdist.cluster.task import Task
from tfdist.errors import DONE_EXIT_CODE, USAGE_EXIT_CODE, RunFailed, UserError
from tfdist.training.inputs import eval_dataset_fn, local_eval_dataset, train_dataset_fn
from tfdist.training.preemption import Preemption
from tfdist.training.roles import finish_together, peer_errors, serve, tell_servers
from tfdist.training.rundir import RunDir
from tfdist.training.session import resolve_cluster, setup_keras, setup_tensorflow


def _evaluate(config, task: Task, verbose: bool) -> dict:
    """The evaluator task: one CPU device, no strategy, a plain model; see ``evaluator.evaluate_checkpoints``."""
    from tfdist import data as data_lib
    from tfdist.models import build_from_config
    from tfdist.training.evaluator import evaluate_checkpoints

    strategies.setup_host(cpu_devices=1)
    setup_keras(config)
    data_lib.validate_data(config.data)
    return evaluate_checkpoints(task, config, model=build_from_config(config.model, config.data),
                                eval_dataset=local_eval_dataset(config), verbose=verbose)


def dump_weights(directory: str | Path, task: Task | None, model) -> Path:
    """Write ``model``'s weights to ``directory/<type>-<index>.npz`` (``local.npz`` without a cluster)."""
    import numpy as np

    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"{f'{task.type}-{task.index}' if task else 'local'}.npz"
    np.savez(path, *model.get_weights())
    return path


def _can_jit(config, strategy) -> bool:
    """``--jit_compile``, where XLA can compile the forward and backward pass.

    With several replicas in sync, batch norm all-reduces its statistics
    inside the pass (a ``merge_call``), which a nested XLA function cannot
    hold; and with op determinism on, XLA lacks deterministic kernels. There
    the pass runs uncompiled and a warning says so.
    """
    if not config.runtime.jit_compile:
        return False
    from absl import logging
    from tensorflow.python.framework.config import is_op_determinism_enabled

    if is_op_determinism_enabled():
        # As Keras does: XLA has no deterministic implementation of some ops (MaxPool's gradient).
        logging.warning("--jit_compile is ignored: op determinism is on (--deterministic) and XLA cannot honour it.")
        return False
    if strategy.num_replicas_in_sync > 1 and config.model.norm in ("batch", "replica_batch"):
        logging.warning(
            "--jit_compile is ignored with %d replicas and --norm %s: cross-replica statistics (batch or moving) "
            "cannot run inside an XLA-compiled step. Use --norm group or none, or one replica per worker, to compile.",
            strategy.num_replicas_in_sync, config.model.norm,
        )
        return False
    return True


def steps_per_epoch(config) -> int:
    """``train.steps_per_epoch``, or the train split's size over the global batch."""
    if config.train.steps_per_epoch:
        return config.train.steps_per_epoch
    from tfdist import data as data_lib

    return max(1, data_lib.num_examples(config.data, "train") // config.train.global_batch_size)


def _check_training(config, task: Task | None, *, in_process_cluster: bool) -> None:
    """What a training task can check before TensorFlow starts: its dataset, and the global batch over the replicas.

    The replicas are known from the strategy, ``--cpu_devices``, the cluster
    and the visible GPUs (``strategies.replicas_in_sync``); a cluster made in
    this process is checked once its strategy exists (``_train``).
    """
    from tfdist import data as data_lib
    from tfdist.data.pipeline import check_global_batch

    data_lib.validate_data(config.data)  # a bad dataset is one line on stderr
    if not in_process_cluster:
        rt = config.runtime
        check_global_batch(config.train.global_batch_size,
                           strategies.replicas_in_sync(rt.strategy, cpu_devices=rt.cpu_devices, task=task))


def run(config, *, verbose: bool = True, cluster_resolver=None, weights_dir: str | Path | None = None,
        clock: list | None = None) -> dict:
    """Train and evaluate ``config``; returns the summary (also written to ``summary.json``).

    Args:
      config: a ``tfdist.config.Config``.
      verbose: print progress on the chief.
      cluster_resolver: a cluster for ``parameter_server`` or
        ``multi_worker_mirrored`` that this process coordinates, e.g. from
        ``tfdist.cluster.local.in_process_cluster``; None reads --cluster/TF_CONFIG.
      weights_dir: if given, every training task writes its final weights
        there (``dump_weights``), to compare workers that write no outputs.
      clock: a list that gets ``(step, time.perf_counter())`` at the end of every chunk of steps
        (``Controller``): the benchmark's timing window.

    Raises:
      UserError: bad input (config, cluster, data, run directory).
      TrainingDiverged: the loss became NaN or Inf.
    """
    wall_start = time.perf_counter()
    config = config_lib.validate(config)
    task = None if cluster_resolver is not None else resolve_cluster(config)
    run_dir = RunDir(config.train.model_dir)
    traits = strategies.traits(config.runtime.strategy)
    kind = traits.role(task.type if task else None)
    if kind == "train":
        _check_training(config, task, in_process_cluster=cluster_resolver is not None)
    run_dir.check_resume(config)
    if kind == "evaluate":
        with Preemption(task.name):  # nothing to save: a signal ends it at once, status 42
            return _evaluate(config, task, verbose)

    def train(strategy, preemption):
        summary, model = _train(config, task, run_dir, strategy, verbose=verbose, wall_start=wall_start,
                                preemption=preemption, clock=clock)
        if weights_dir is not None:
            dump_weights(weights_dir, task, model)
        return summary

    return run_task(config, task, run_dir, train, cluster_resolver=cluster_resolver, verbose=verbose)


def run_task(config, task: Task | None, run_dir: RunDir, train, *, cluster_resolver=None, verbose: bool = True,
             keras_setup: bool = True, strategy=None):
    """What every training client (``run``, ``tfdist.fit``) does with its task once its input is checked.

    A serving task serves (and never returns); a training task sets up
    TensorFlow and the strategy (``session.setup_tensorflow``; ``strategy``: the one a
    ``tfdist.setup`` made already), then calls
    ``train(strategy, preemption)`` under ``Preemption`` and ``peer_errors``,
    finishes with its peers, and under a coordinator tells the serving tasks
    how the run ended. Returns what ``train`` returned. ``keras_setup`` False
    leaves Keras' precision policy and seeds as the caller set them
    (``tfdist.fit``, as Keras' own ``fit`` does).
    """
    rt = config.runtime
    traits = strategies.traits(rt.strategy)
    if task is not None and strategy is None:
        peers.check_port_free(task)
    if traits.role(task.type if task else None) == "serve":
        serve(task, connect_timeout=rt.connect_timeout, verbose=verbose, heartbeats=run_dir.heartbeats)
    with Preemption(task.name if task else "local") as preemption:
        try:
            if strategy is None:
                strategy = setup_tensorflow(config, task, cluster_resolver, keras_setup=keras_setup)
            with peer_errors(task, rt.strategy, run_dir):
                result = train(strategy, preemption)
                finish_together(task, traits, rt.connect_timeout)
        except (RunFailed, UserError) as e:
            if traits.coordinator:
                tell_servers(task, e.exit_code if isinstance(e, RunFailed) else USAGE_EXIT_CODE)
            raise
    if traits.coordinator:
        tell_servers(task, DONE_EXIT_CODE)
    return result


def _train(config, task: Task | None, run_dir: RunDir, strategy, *, verbose: bool, wall_start: float,
           preemption: Preemption | None = None, clock: list | None = None):
    """Build, restore, train, evaluate and write the outputs under ``strategy``; returns the summary and model."""
    import tensorflow as tf

    from tfdist.data.pipeline import check_global_batch
    from tfdist.models import build_from_config
    from tfdist.training.checkpoints import Checkpoints
    from tfdist.training.drive import drive
    from tfdist.training.optimizers import learning_rate_at, make_optimizer
    from tfdist.training.outputs import RunOutputs
    from tfdist.training.step import Steps

    train_cfg = config.train
    # Checked before TensorFlow started (_check_training); again with the replicas the strategy really has.
    check_global_batch(train_cfg.global_batch_size, strategy.num_replicas_in_sync)
    epoch_steps = steps_per_epoch(config)
    total_steps = train_cfg.epochs * epoch_steps

    with strategy.scope():
        model = build_from_config(config.model, config.data)
        optimizer = make_optimizer(train_cfg, config.runtime.precision, total_steps)
        optimizer.build(model.trainable_variables)
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    traits = strategies.traits(config.runtime.strategy)
    is_chief = task is None or task.is_leader
    checkpoints = Checkpoints(checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_counter),
                              run_dir=run_dir, is_chief=is_chief, task=task.name if task else "local")
    restored = checkpoints.restore_latest()
    start_step = int(step_counter.numpy())
    outputs = RunOutputs(run_dir=run_dir, is_chief=is_chief)
    outputs.write_params(config)
    if verbose and is_chief:
        where = f"resuming from {restored} at step {start_step}" if restored else "starting at step 0"
        print(f"tfdist: {config.runtime.strategy} with {strategy.num_replicas_in_sync} replicas, "
              f"global batch {train_cfg.global_batch_size}, {total_steps} steps; {where}", flush=True)

    steps = Steps(model=model, optimizer=optimizer, num_classes=config.data.num_classes,
                  global_batch_size=train_cfg.global_batch_size, jit_compile=_can_jit(config, strategy))
    if traits.coordinator:
        tf.random.set_seed(None)  # weights are initialised; now each worker's data order is its own
    controller, loop, final_eval = drive(
        runtime=config.runtime, task=task, run_dir=run_dir, strategy=strategy, steps=steps, step_counter=step_counter,
        checkpoints=checkpoints, outputs=outputs, start_step=start_step, total_steps=total_steps,
        train_dataset_fn=train_dataset_fn(config, start_step, own_order_per_worker=traits.coordinator),
        eval_dataset_fn=eval_dataset_fn(config), preemption=preemption,
        global_batch_size=train_cfg.global_batch_size, steps_per_epoch=epoch_steps,
        steps_per_loop=train_cfg.steps_per_loop, log_every=train_cfg.log_every,
        checkpoint_every=train_cfg.checkpoint_every,
        learning_rate=lambda s: learning_rate_at(train_cfg, total_steps, s),
        preview=next(iter(local_eval_dataset(config).unbatch().batch(4).take(1))) if is_chief else None,
        verbose=verbose and is_chief, clock=clock,
    )
    if is_chief and train_cfg.export:
        plain = build_from_config(config.model, config.data)
        plain.set_weights(model.get_weights())
        outputs.export(plain)
    summary = {
        "strategy": config.runtime.strategy,
        "num_replicas": int(strategy.num_replicas_in_sync),
        "num_workers": traits.num_workers(task),
        "is_chief": is_chief,
        "global_batch_size": train_cfg.global_batch_size,
        "steps": int(step_counter.numpy()),
        "start_step": start_step,
        "final_loss": controller.last_train.get("loss") if controller.last_train else None,
        "eval": {k: final_eval[k] for k in ("loss", "mean_iou", "pixel_accuracy")},
        "images_per_second": controller.images_per_second,
        "first_step_at": controller.first_step_at,
        "wall_seconds": time.perf_counter() - wall_start,
        "precision": config.runtime.precision,
        "model_dir": str(train_cfg.model_dir),
        "variable_devices": sorted({v.value.device for v in model.variables}),
        # Under a coordinator: the closures of this run whose result each worker returned (CoordinatorLoop).
        **({"closures_per_worker": loop.closures_per_worker} if traits.coordinator else {}),
    }
    outputs.write_summary(summary)
    return summary, model
