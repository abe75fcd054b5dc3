"""The UNet experiment, ``tfdist.train``'s library side: ``run(config)`` checks everything the user gave before
anything is written or TensorFlow starts, then starts the task and trains it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from tfdist import config as config_lib
from tfdist import strategies
from tfdist.engine.controller import Schedule
from tfdist.engine.task import Hook
from tfdist.rundir import RunDir
from tfdist.runtime.lifecycle import training_task
from tfdist.runtime.session import place
from tfdist.segmentation import config as experiment_config


def schedule_of(config) -> Schedule:
    """The run's ``Schedule``: ``epochs`` of ``steps_per_epoch`` steps (or the train split over the global batch)."""
    train = config.train
    epoch_steps = train.steps_per_epoch
    if not epoch_steps:
        from tfdist import data as data_lib

        epoch_steps = max(1, data_lib.num_examples(config.data, "train") // train.global_batch_size)
    return Schedule(total_steps=train.epochs * epoch_steps, steps_per_epoch=epoch_steps,
                    steps_per_loop=train.steps_per_loop, log_every=train.log_every,
                    checkpoint_every=train.checkpoint_every)


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
        there (``TrainingState.dump_weights``), to compare workers that write no outputs.
      hooks: ``engine.task.Hook``s the caller runs between chunks of steps (the benchmark's clock and
        hold); the chief adds the mask preview after them.

    Raises:
      UserError: bad input (config, cluster, data, run directory).
      TrainingDiverged: the loss became NaN or Inf.
    """
    wall_start = time.perf_counter()
    config = experiment_config.validate(config)
    placement = place(config.runtime, in_process=cluster_resolver is not None)
    run_dir = RunDir(config.train.model_dir)
    run_dir.check_place()  # before the dataset's checks, which may start TensorFlow
    if placement.role == "train":
        experiment_config.check_training(config, placement, in_process_cluster=cluster_resolver is not None)
    run_dir.check_resume(config_lib.to_dict(config))
    if placement.role == "evaluate":
        from tfdist.segmentation.evaluator import run_evaluator

        return run_evaluator(config, placement, verbose=verbose)

    import tensorflow as tf  # after the checks: bad input is refused without TensorFlow's start-up

    from tfdist.engine.outputs import RunOutputs
    from tfdist.engine.state import build_state
    from tfdist.models import build_from_config
    from tfdist.runtime.run_loop import run_loop
    from tfdist.segmentation.optimizers import make_optimizer
    from tfdist.segmentation.task import unet_task

    train_cfg, runtime = config.train, config.runtime
    with training_task(runtime, placement, run_dir, where="tfdist.train", cluster_resolver=cluster_resolver,
                       verbose=verbose, seed=train_cfg.seed, deterministic=train_cfg.deterministic) as training:
        strategy = training.strategy
        # Checked before TensorFlow started (check_training); again with the replicas the strategy really has.
        strategies.check_global_batch(train_cfg.global_batch_size, strategy.num_replicas_in_sync)
        schedule = schedule_of(config)
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
        task = unet_task(config, state, strategy, total_steps=schedule.total_steps, start_step=start_step,
                         coordinator=placement.coordinator, hooks=hooks, preview=placement.is_chief)
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
            state.dump_weights(weights_dir, placement.task.slug)
    return summary
