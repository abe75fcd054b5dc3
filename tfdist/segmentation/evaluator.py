"""The UNet's evaluator task: what the engine's continuous evaluation (``engine.evaluator``) evaluates with, the
UNet's eval plan, and when its run is over.

An ``evaluator`` task (under either cluster strategy) never joins the
training cluster: the training tasks get a TF_CONFIG without it
(``Task.tf_config(training=True)``), because ``MultiWorkerMirroredStrategy``
would give an evaluator a cluster of its own and ``ParameterServerStrategy``'s
coordinator connects to every task it is told of. It reads the checkpoints
from the run directory, which it must share with the chief, and writes only
files of its own (``evaluator.jsonl``, ``tensorboard/evaluator``).
"""

from __future__ import annotations

import time

from tfdist.engine.evaluator import Evaluated, Evaluation, RunEnd
from tfdist.rundir import RunDir


def unet_evaluation(config, state, run_dir: RunDir) -> Evaluation:
    """The UNet's eval steps over ``state``'s model on ``config``'s eval split, until the run is over: once the
    chief has written ``summary.json`` (one newer than this evaluation, so that a resumed run's old summary does
    not count).

    Args:
        config: the run's config.
        state: the evaluator's ``engine.state.TrainingState`` (``engine.evaluator.evaluation_state``).
        run_dir: the run directory, where the chief writes its checkpoints and summary.
    """
    import tensorflow as tf

    from tfdist.segmentation.plan import unet_plan

    started = time.time()
    plan = unet_plan(config, state, tf.distribute.get_strategy(), total_steps=0, start_step=0, coordinator=False)
    return Evaluation(plan=plan, ends=RunEnd(finished=lambda: _written_since(run_dir.summary, started)))


def evaluator_summary(evaluated: Evaluated, run_dir: RunDir) -> dict:
    """What the UNet's evaluator task returns: ``{"role": "evaluator", "evaluated": [steps...], "last": metrics,
    "model_dir": ...}``."""
    return {"role": "evaluator", "evaluated": evaluated.steps, "last": evaluated.last, "model_dir": str(run_dir.path)}


def _written_since(path, started: float) -> bool:
    """Whether ``path`` exists, written at ``started`` (a ``time.time()``) or later."""
    return path.exists() and path.stat().st_mtime >= started
