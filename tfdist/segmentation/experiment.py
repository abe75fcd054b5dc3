"""The UNet experiment, ``tfdist.train``'s library side: ``run(config)`` checks the config and hands the run's
``UNetClient`` to the driver, which checks the rest before anything is written or TensorFlow starts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from tfdist import config as config_lib
from tfdist import strategies
from tfdist.engine.client import Client
from tfdist.engine.controller import Schedule
from tfdist.engine.plan import Hook
from tfdist.rundir import RunDir
from tfdist.runtime import driver
from tfdist.segmentation import config as experiment_config


def schedule_of(config) -> Schedule:
    """The run's ``Schedule``: ``epochs`` of ``steps_per_epoch`` steps (or the train split over the global batch)."""
    train = config.train
    epoch_steps = train.steps_per_epoch
    if not epoch_steps:
        from tfdist import data as data_lib

        epoch_steps = max(1, data_lib.num_examples(config.data, "train") // train.global_batch_size)
    # Chunks grow past steps_per_loop: the experiment's hooks (the mask preview, a benchmark's clock and hold)
    # read the run between chunks of any length.
    return Schedule(total_steps=train.epochs * epoch_steps, steps_per_epoch=epoch_steps,
                    steps_per_loop=train.steps_per_loop, log_every=train.log_every,
                    checkpoint_every=train.checkpoint_every, grow=True)


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
      hooks: ``engine.plan.Hook``s the caller runs between chunks of steps (the benchmark's clock and
        hold); the chief adds the mask preview after them.

    Raises:
      UserError: bad input (config, cluster, data, run directory).
      TrainingDiverged: the loss became NaN or Inf.
    """
    started = time.perf_counter()
    config = experiment_config.validate(config)
    client = UNetClient(config, started=started, in_process_cluster=cluster_resolver is not None,
                        weights_dir=weights_dir)
    return driver.run(client, config.runtime, RunDir(config.train.model_dir), cluster_resolver=cluster_resolver,
                      verbose=verbose, hooks=hooks)


class UNetClient(Client):
    """The UNet on ``config``'s data, as a client of the driver (``engine.client.Client``).

    Args:
      config: the validated ``Config``, written as ``params.yaml``.
      started: ``time.perf_counter()`` when the run was asked for (the summary's ``wall_seconds``).
      in_process_cluster: this process coordinates an in-process cluster.
      weights_dir: where every training task writes its final weights, or None.
    """

    where = "tfdist.train"

    def __init__(self, config, *, started: float, in_process_cluster: bool = False,
                 weights_dir: str | Path | None = None):
        self.config = config
        self.params = config
        self.started = started
        self.in_process_cluster = in_process_cluster
        self.weights_dir = weights_dir
        self.replicas = 0  # the strategy's, once the task has started
        self.start_step = 0
        self._schedule: Schedule | None = None

    def check(self, placement, run_dir) -> None:
        run_dir.check_place()  # before the dataset's checks, which may start TensorFlow
        if placement.role == "train":
            experiment_config.check_training(self.config, placement, in_process_cluster=self.in_process_cluster)
        elif placement.role == "evaluate":
            from tfdist import data as data_lib

            data_lib.validate_data(self.config.data)
        run_dir.check_resume(config_lib.to_dict(self.config))

    def prepare(self, strategy, placement) -> None:
        train, self.replicas = self.config.train, strategy.num_replicas_in_sync
        strategies.setup_keras(self.config.runtime.precision, seed=train.seed, deterministic=train.deterministic)
        # Checked before TensorFlow started (check_training); again with the replicas the strategy really has.
        strategies.check_global_batch(train.global_batch_size, self.replicas)

    def build(self):
        from tfdist.models import build_from_config
        from tfdist.segmentation.optimizers import make_optimizer

        config = self.config
        return (build_from_config(config.model, config.data),
                make_optimizer(config.train, config.runtime.precision, self.schedule().total_steps))

    def plan(self, state, strategy, placement, run_dir):
        import tensorflow as tf

        from tfdist.segmentation.plan import unet_plan

        self.start_step = int(state.step.numpy())
        if placement.coordinator:
            tf.random.set_seed(None)  # weights are initialised; now each worker's data order is its own
        return unet_plan(self.config, state, strategy, total_steps=self.schedule().total_steps,
                         start_step=self.start_step, coordinator=placement.coordinator, preview=placement.is_chief)

    def schedule(self) -> Schedule:
        if self._schedule is None:  # the optimizer's learning rate needs it first
            self._schedule = schedule_of(self.config)
        return self._schedule

    def banner(self, placement, replicas: int, schedule: Schedule) -> str:
        return (f"tfdist: {placement.strategy} with {replicas} replicas, "
                f"global batch {self.config.train.global_batch_size}, {schedule.total_steps} steps")

    def finish(self, state, result, placement, outputs) -> dict:
        train = self.config.train
        state.finalize_ema()  # the moving averages, as Keras' fit leaves them
        if placement.is_chief and train.export:
            from tfdist.models import build_from_config

            plain = build_from_config(self.config.model, self.config.data)
            plain.set_weights(state.model.get_weights())
            outputs.export(plain)
        summary = {
            "strategy": placement.strategy,
            "num_replicas": int(self.replicas),
            "num_workers": placement.num_workers,
            "is_chief": placement.is_chief,
            "global_batch_size": train.global_batch_size,
            "steps": result.step,
            "start_step": self.start_step,
            "final_loss": result.last_train.get("loss") if result.last_train else None,
            "eval": {k: result.final_eval[k] for k in ("loss", "mean_iou", "pixel_accuracy")},
            "images_per_second": result.throughput,
            "largest_chunk": result.largest_chunk,  # above steps_per_loop: chunks grew (engine.chunks)
            "first_step_at": result.first_step_at,
            "wall_seconds": time.perf_counter() - self.started,
            "precision": self.config.runtime.precision,
            "model_dir": str(train.model_dir),
            "variable_devices": sorted({v.value.device for v in state.model.variables}),
            # Under a coordinator: the closures of this run whose result each worker returned (CoordinatorLoop).
            **({"closures_per_worker": result.closures_per_worker} if placement.coordinator else {}),
        }
        outputs.write_summary(summary)
        if self.weights_dir is not None:
            state.dump_weights(self.weights_dir, placement.task.slug)
        return summary

    def evaluation(self, state, placement, run_dir):
        from tfdist.segmentation.evaluator import unet_evaluation

        return unet_evaluation(self.config, state, run_dir)

    def evaluated(self, evaluated) -> dict:
        from tfdist.segmentation.evaluator import evaluator_summary

        return evaluator_summary(evaluated, RunDir(self.config.train.model_dir))
