"""The UNet experiment, ``tfdist.train``'s library side: ``run(config)`` checks everything the user gave before
anything is written or TensorFlow starts, then starts the task and trains it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from tfdist import config as config_lib
from tfdist.segmentation import config as experiment_config
from tfdist import strategies
from tfdist.cluster.task import Task
from tfdist.engine.controller import Schedule
from tfdist.engine.task import Hook
from tfdist.rundir import RunDir
from tfdist.runtime.lifecycle import training_task
from tfdist.runtime.placement import Placement
from tfdist.runtime.preemption import Preemption
from tfdist.runtime.session import place, setup_keras
from tfdist.segmentation.inputs import local_eval_dataset
from tfdist import _compat


def _evaluate(config, placement: Placement, verbose: bool) -> dict:
    """The evaluator task: one CPU device, no strategy, a plain model; see ``evaluator.evaluate_checkpoints``."""
    from tfdist import data as data_lib
    from tfdist.models import build_from_config
    from tfdist.segmentation.evaluator import evaluate_checkpoints

    strategies.setup_host(cpu_devices=1)
    setup_keras(config.runtime.precision, seed=config.train.seed, deterministic=config.train.deterministic)
    data_lib.validate_data(config.data)
    return evaluate_checkpoints(placement.task, config, model=build_from_config(config.model, config.data),
                                eval_dataset=local_eval_dataset(config), verbose=verbose)


def dump_weights(directory: str | Path, task: Task, model) -> Path:
    """Write ``model``'s weights to ``directory/<task.slug>.npz``: ``worker-1.npz``, ``local.npz``."""
    import numpy as np

    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"{task.slug}.npz"
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

    if _compat.op_determinism_enabled():
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


def _check_training(config, placement: Placement, *, in_process_cluster: bool) -> None:
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
                           strategies.replicas_in_sync(placement.traits, cpu_devices=rt.cpu_devices,
                                                       task=placement.task))


def run(config, *, verbose: bool = True, cluster_resolver=None, weights_dir: str | Path | None = None,
        hooks: Sequence[Hook] = ()) -> dict:
    """Train and evaluate ``config``; returns the summary (also written to ``summary.json``).

    Args:
      config: a ``tfdist.segmentation.config.Config``.
      verbose: print progress on the chief.
      cluster_resolver: a cluster for ``parameter_server`` or
        ``multi_worker_mirrored`` that this process coordinates, e.g. from
        ``tfdist.deploy.in_process.in_process_cluster``; None reads --cluster/TF_CONFIG.
      weights_dir: if given, every training task writes its final weights
        there (``dump_weights``), to compare workers that write no outputs.
      hooks: ``engine.task.Hook``s the caller runs between chunks of steps (the benchmark's clock and
        hold); the chief adds the mask preview after them.

    Raises:
      UserError: bad input (config, cluster, data, run directory).
      TrainingDiverged: the loss became NaN or Inf.
    """
    import tensorflow as tf

    from tfdist.data.pipeline import check_global_batch
    from tfdist.engine.outputs import RunOutputs
    from tfdist.engine.state import build_state
    from tfdist.models import build_from_config
    from tfdist.runtime.run_loop import run_loop
    from tfdist.segmentation.optimizers import make_optimizer
    from tfdist.segmentation.task import unet_task

    wall_start = time.perf_counter()
    config = experiment_config.validate(config)
    placement = place(config.runtime, in_process=cluster_resolver is not None)
    run_dir = RunDir(config.train.model_dir)
    run_dir.check_place()  # before the dataset's checks, which may start TensorFlow
    if placement.role == "train":
        _check_training(config, placement, in_process_cluster=cluster_resolver is not None)
    run_dir.check_resume(config_lib.to_dict(config))
    if placement.role == "evaluate":
        with Preemption(placement.name):  # nothing to save: a signal ends it at once, status 42
            return _evaluate(config, placement, verbose)

    train_cfg, runtime = config.train, config.runtime
    with training_task(runtime, placement, run_dir, where="tfdist.train", cluster_resolver=cluster_resolver,
                       verbose=verbose, seed=train_cfg.seed, deterministic=train_cfg.deterministic) as training:
        strategy = training.strategy
        # Checked before TensorFlow started (_check_training); again with the replicas the strategy really has.
        check_global_batch(train_cfg.global_batch_size, strategy.num_replicas_in_sync)
        epoch_steps = steps_per_epoch(config)
        schedule = Schedule(total_steps=train_cfg.epochs * epoch_steps, steps_per_epoch=epoch_steps,
                            steps_per_loop=train_cfg.steps_per_loop, log_every=train_cfg.log_every,
                            checkpoint_every=train_cfg.checkpoint_every)
        state = build_state(
            strategy, lambda: (build_from_config(config.model, config.data),
                               make_optimizer(train_cfg, runtime.precision, schedule.total_steps)),
            run_dir=run_dir, is_chief=placement.is_chief, task=placement.name)
        start_step = int(state.step.numpy())
        outputs = RunOutputs(run_dir=run_dir, is_chief=placement.is_chief)
        outputs.write_params(config)
        if verbose and placement.is_chief:
            print(f"tfdist: {placement.strategy} with {strategy.num_replicas_in_sync} replicas, "
                  f"global batch {train_cfg.global_batch_size}, {schedule.total_steps} steps; {state.start()}",
                  flush=True)
        if placement.coordinator:
            tf.random.set_seed(None)  # weights are initialised; now each worker's data order is its own
        task = unet_task(config, state, total_steps=schedule.total_steps, start_step=start_step,
                         jit_compile=_can_jit(config, strategy), coordinator=placement.coordinator,
                         hooks=hooks, preview=placement.is_chief)
        result = run_loop(training, state, task, schedule, outputs=outputs, verbose=verbose and placement.is_chief)
        state.finalize_ema()  # the moving averages, as Keras' fit leaves them
        if placement.is_chief and train_cfg.export:
            plain = build_from_config(config.model, config.data)
            plain.set_weights(state.model.get_weights())
            outputs.export(plain)
        summary = {
            "strategy": placement.strategy,
            "num_replicas": int(strategy.num_replicas_in_sync),
            "num_workers": placement.num_workers,
            "is_chief": placement.is_chief,
            "global_batch_size": train_cfg.global_batch_size,
            "steps": result.step,
            "start_step": start_step,
            "final_loss": result.last_train.get("loss") if result.last_train else None,
            "eval": {k: result.final_eval[k] for k in ("loss", "mean_iou", "pixel_accuracy")},
            "images_per_second": result.throughput,
            "first_step_at": result.first_step_at,
            "wall_seconds": time.perf_counter() - wall_start,
            "precision": runtime.precision,
            "model_dir": str(train_cfg.model_dir),
            "variable_devices": sorted({v.value.device for v in state.model.variables}),
            # Under a coordinator: the closures of this run whose result each worker returned (CoordinatorLoop).
            **({"closures_per_worker": result.closures_per_worker} if placement.coordinator else {}),
        }
        outputs.write_summary(summary)
        if weights_dir is not None:
            dump_weights(weights_dir, placement.task, state.model)
    return summary
