"""The UNet's evaluator task: the engine's continuous evaluation (``engine.evaluator``) over the UNet's task.

An ``evaluator`` task (under either cluster strategy) never joins the
training cluster: the training tasks get a TF_CONFIG without it
(``Task.tf_config(training=True)``), because ``MultiWorkerMirroredStrategy``
would give an evaluator a cluster of its own and ``ParameterServerStrategy``'s
coordinator connects to every task it is told of. It reads the checkpoints
from the run directory, which it must share with the chief, and writes only
files of its own (``evaluator.jsonl``, ``tensorboard/evaluator``).
"""

from __future__ import annotations

import dataclasses
import time

from tfdist.cluster.task import Task
from tfdist.engine.evaluator import evaluate_continuously, evaluation_state
from tfdist.rundir import RunDir


def run_evaluator(config, placement, *, verbose: bool = True) -> dict:
    """The evaluator task of ``tfdist.train``, once the driver started it (one CPU device, no strategy): a plain
    model that follows the chief's checkpoints (``evaluate_checkpoints``).

    Args:
        config: the run's config, validated.
        placement: the evaluator's ``runtime.placement.Placement``.
        verbose: print a line per evaluated checkpoint.
    """
    from tfdist import strategies
    from tfdist.models import build_from_config

    strategies.setup_keras(config.runtime.precision, seed=config.train.seed, deterministic=config.train.deterministic)
    return evaluate_checkpoints(placement.task, config, model=build_from_config(config.model, config.data),
                                verbose=verbose)


def evaluate_checkpoints(task: Task, config, *, model, eval_dataset=None, verbose: bool = True) -> dict:
    """Evaluate each checkpoint of ``model_dir/checkpoints`` with the UNet's eval steps, oldest first
    (``engine.evaluator.evaluate_continuously``).

    It ends after evaluating the final checkpoint, once the chief has written
    ``summary.json`` (one newer than the evaluator's start, so that a resumed
    run's old summary does not count). If the leader never answers within
    ``--connect_timeout`` it ends with a ``UserError``; if the leader stops
    answering before that summary, with ``RunFailed``.

    Args:
        task: the evaluator's task (for the leader's address).
        config: the run's config.
        model: a model built like the training one (variables to restore into).
        eval_dataset: a finite dataset of ``(images, masks)`` batches to evaluate instead of the run's eval split.
        verbose: print a line per evaluated checkpoint.

    Returns:
        ``{"role": "evaluator", "evaluated": [steps...], "last": metrics, "model_dir": ...}``.
    """
    import tensorflow as tf

    from tfdist.segmentation.plan import unet_plan

    run_dir = RunDir(config.train.model_dir)
    started = time.time()
    state = evaluation_state(model, run_dir)
    unet = unet_plan(config, state, tf.distribute.get_strategy(), total_steps=0, start_step=0, coordinator=False)
    if eval_dataset is not None:
        unet = dataclasses.replace(unet, eval_dataset_fn=lambda context: eval_dataset)

    def summary_written() -> bool:
        return run_dir.summary.exists() and run_dir.summary.stat().st_mtime >= started

    evaluated = evaluate_continuously(unet, state, leader=task.leader, connect_timeout=config.runtime.connect_timeout,
                                      finished=summary_written, verbose=verbose)
    return {"role": "evaluator", "evaluated": evaluated.steps, "last": evaluated.last, "model_dir": str(run_dir.path)}
