"""The UNet's evaluator side-car (the driver's evaluator run of its client) over checkpoints written faster than it
evaluates them, in this process.

The chief's checkpoints are written before the evaluator looks (as when
training outruns an evaluation), so only an evaluator that walks the list
of kept checkpoints, not just the latest, evaluates each of them. Each row
must hold the loss of its own checkpoint's weights.
"""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np
import tensorflow as tf

from tfdist import cluster as cluster_lib
from tfdist import strategies
from tfdist.segmentation import config as experiment_config
from tfdist.models import build_from_config
from tfdist.segmentation import inputs
from tfdist.engine.checkpoints import Checkpoints
from tfdist.segmentation.steps import metrics_from_stats
from tfdist.rundir import RunDir
from tfdist.runtime import driver
from tfdist.runtime.placement import Placement
from tfdist.segmentation.experiment import UNetClient
from tfdist.segmentation.steps import Steps


def eval_loss(model, config) -> float:
    steps = Steps(model=model, optimizer=None, num_classes=config.data.num_classes,
                  global_batch_size=config.train.global_batch_size)
    total = sum(steps.evaluate(batch).numpy() for batch in inputs.local_eval_dataset(config))
    return metrics_from_stats(total, config.data.num_classes)["loss"]


def test_the_evaluator_evaluates_every_kept_checkpoint_once_oldest_first(tmp_path):
    config = experiment_config.build_config(overrides={
        "strategy": "multi_worker_mirrored", "image_size": 32, "train_examples": 16, "eval_examples": 16,
        "base_filters": 4, "depth": 2, "global_batch_size": 8, "model_dir": str(tmp_path / "run")})
    run_dir = RunDir(config.train.model_dir)
    chief_model = build_from_config(config.model, config.data)
    checkpoints = Checkpoints(checkpoint=tf.train.Checkpoint(model=chief_model), run_dir=run_dir, is_chief=True)
    rng = np.random.default_rng(0)
    losses = {}
    for step in (10, 20, 30, 40):  # the chief keeps the last 3: ckpt-10 is rotated away by ckpt-40
        chief_model.set_weights([w + rng.normal(0, 0.05, w.shape).astype(w.dtype) for w in chief_model.get_weights()])
        losses[step] = eval_loss(chief_model, config)
        checkpoints.save(step)
    assert len(set(losses.values())) == 4  # four different models
    # An earlier evaluator of this run already evaluated step 20.
    run_dir.evaluator_metrics.write_text(json.dumps({"step": 20, "split": "evaluator", "loss": -1.0}) + "\n")
    run_dir.summary.write_text("{}\n")
    future = time.time() + 3600  # newer than the evaluator's start: the chief is done
    os.utime(run_dir.summary, (future, future))

    with socket.socket() as chief:  # the leader answers while the evaluator runs
        chief.bind(("127.0.0.1", 0))
        chief.listen()
        spec = cluster_lib.parse_cluster_spec(
            {"chief": f"127.0.0.1:{chief.getsockname()[1]}", "worker": "127.0.0.1:1", "evaluator": "127.0.0.1:2"},
            source="test")
        placement = Placement(strategy="multi_worker_mirrored", traits=strategies.traits("multi_worker_mirrored"),
                              task=cluster_lib.Task(spec=spec, type="evaluator", index=0))
        result = driver.evaluate(UNetClient(config, started=time.perf_counter()), placement, run_dir,
                                 connect_timeout=config.runtime.connect_timeout, verbose=False)

    assert result["evaluated"] == [30, 40]  # 10 rotated away, 20 already there; not only the latest
    rows = [json.loads(line) for line in run_dir.evaluator_metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [20, 30, 40]
    for row in rows[1:]:
        assert abs(row["loss"] - losses[row["step"]]) < 1e-5, (row, losses)
