"""The evaluator side-car: it follows the chief's checkpoints and evaluates each one.

An ``evaluator`` task (under either cluster strategy) never joins the
training cluster: the training tasks get a TF_CONFIG without it
(``Task.tf_config(training=True)``), because ``MultiWorkerMirroredStrategy``
would give an evaluator a cluster of its own and ``ParameterServerStrategy``'s
coordinator connects to every task it is told of. It reads the checkpoints
from the run directory, which it must share with the chief, and writes only
files of its own (``evaluator.jsonl``, ``tensorboard/evaluator``).
"""

from __future__ import annotations

import json
import time

import numpy as np
import tensorflow as tf

from tfdist.cluster.peers import POLL_SECONDS, PeerWatch
from tfdist.cluster.task import Task
from tfdist.errors import RunFailed
from tfdist.engine.outputs import RunOutputs
from tfdist.rundir import RunDir
from tfdist.segmentation.steps import Steps, stats_size


def run_evaluator(config, placement, *, verbose: bool = True) -> dict:
    """The evaluator task of ``tfdist.train``: one CPU device, no strategy, a plain model that follows the chief's
    checkpoints (``evaluate_checkpoints``). A preemption ends it at once, status 42: it has nothing to save.

    Args:
        config: the run's config, validated.
        placement: the evaluator's ``runtime.placement.Placement``.
        verbose: print a line per evaluated checkpoint.
    """
    from tfdist import data as data_lib
    from tfdist import strategies
    from tfdist.models import build_from_config
    from tfdist.runtime.preemption import Preemption
    from tfdist.segmentation.inputs import local_eval_dataset

    with Preemption(placement.name):
        strategies.setup_host(cpu_devices=1)
        strategies.setup_keras(config.runtime.precision, seed=config.train.seed,
                               deterministic=config.train.deterministic)
        data_lib.validate_data(config.data)
        return evaluate_checkpoints(placement.task, config, model=build_from_config(config.model, config.data),
                                    eval_dataset=local_eval_dataset(config), verbose=verbose)


def evaluate_checkpoints(task: Task, config, *, model, eval_dataset, verbose: bool = True) -> dict:
    """The evaluator side-car: evaluate each checkpoint of ``model_dir/checkpoints``, oldest first.

    Every checkpoint the chief keeps (``CheckpointManager``'s list, not only
    the latest) is evaluated once; steps that ``evaluator.jsonl`` already
    has (an earlier evaluator of the run) are skipped. A checkpoint that the
    chief rotated away (it keeps the last 3) before the evaluator read it is
    skipped too: the evaluator cannot keep it.

    Rows go to ``model_dir/evaluator.jsonl`` (``split: "evaluator"``) and
    scalars to ``tensorboard/evaluator``, never into the chief's files. It
    ends after evaluating the final checkpoint, once the chief has written
    ``summary.json`` (one newer than the evaluator's start, so that a resumed
    run's old summary does not count). If the leader never answers within
    ``--connect_timeout`` it ends with a ``UserError``; if the leader stops
    answering before that summary, with ``RunFailed``.

    Args:
        task: the evaluator's task (for the leader's address).
        config: the run's config.
        model: a model built like the training one (variables to restore into).
        eval_dataset: a finite dataset of ``(images, masks)`` batches.
        verbose: print a line per evaluated checkpoint.

    Returns:
        ``{"role": "evaluator", "evaluated": [steps...], "last": metrics}``.
    """
    run_dir = RunDir(config.train.model_dir)
    directory = str(run_dir.checkpoints)
    summary = run_dir.summary
    started = time.time()
    leader = PeerWatch.of(task.leader)
    leader.wait_up(config.runtime.connect_timeout, why="the evaluator follows its checkpoints")
    num_classes = config.data.num_classes
    steps = Steps(model=model, optimizer=None, num_classes=num_classes,
                  global_batch_size=config.train.global_batch_size)
    eval_batch = tf.function(steps.evaluate)
    checkpoint = tf.train.Checkpoint(model=model)
    outputs = RunOutputs(run_dir=run_dir, is_chief=True, evaluator=True)
    evaluated: list[int] = []
    done = _steps_in(run_dir.evaluator_metrics)
    last = None

    def summary_written() -> bool:
        return summary.exists() and summary.stat().st_mtime >= started

    def pending() -> list[tuple[int, str]]:
        """``(step, path)`` of the kept checkpoints not evaluated yet, oldest first."""
        state = tf.train.get_checkpoint_state(directory)
        listed = [(int(path.rsplit("-", 1)[1]), path) for path in (state.all_model_checkpoint_paths if state else [])]
        return sorted(item for item in listed if item[0] not in done)

    try:
        while True:
            finished = summary_written()  # before the list: the final checkpoint is listed before the summary
            waiting = pending()
            if waiting:
                step, path = waiting[0]
                try:
                    checkpoint.restore(path).expect_partial()
                except (tf.errors.NotFoundError, tf.errors.DataLossError):
                    time.sleep(POLL_SECONDS)  # rotated away meanwhile (then no longer listed): read the list again
                    continue
                total = np.zeros([stats_size(num_classes)], np.float32)
                for batch in eval_dataset:
                    total += eval_batch(batch).numpy()
                last = steps.metrics(total)
                outputs.log("evaluator", step, last)
                evaluated.append(step)
                done.add(step)
                if verbose:
                    print(f"evaluator step {step}: loss {last['loss']:.4f}  pixel_accuracy "
                          f"{last['pixel_accuracy']:.4f}  mean_iou {last['mean_iou']:.4f}", flush=True)
                continue
            if finished:
                break
            if leader.gone():
                raise RunFailed(
                    f"The leader {leader.name} at {leader.address} stopped answering before it wrote {summary}. "
                    f"Received: checkpoints evaluated at steps {evaluated or 'none'}. "
                    "Expected the run to finish; relaunch it to resume from its latest checkpoint."
                )
            time.sleep(POLL_SECONDS)
    finally:
        outputs.close()
    return {"role": "evaluator", "evaluated": evaluated, "last": last, "model_dir": str(run_dir.path)}


def _steps_in(rows) -> set[int]:
    """The steps of the rows of ``evaluator.jsonl`` (none if it does not exist; a torn last line is ignored)."""
    steps = set()
    if rows.exists():
        for line in rows.read_text().splitlines():
            try:
                steps.add(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                pass
    return steps
