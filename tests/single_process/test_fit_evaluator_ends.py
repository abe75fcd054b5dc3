"""How ``tfdist.fit``'s side-car evaluator ends when the chief stops before the run's last step, in this process.

The chief's checkpoints of epochs 1 and 2 are written here in its layout (``build_state``), and a listening
socket stands for the chief. In a run of 2 epochs the evaluator returns after the second, the chief still up.
In a run of 4, once the evaluator has evaluated both, the socket closes: a chief that ended well (a callback's
``stop_training``) removed its heartbeat, and the evaluator returns what it evaluated; a chief whose heartbeat
is left (killed, preempted) ends the evaluator with ``RunFailed``.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist import strategies
from tfdist.cluster import parse_cluster_spec
from tfdist.cluster.task import Task
from tfdist.engine.state import build_state
from tfdist.errors import RunFailed
from tfdist.fitting.evaluator import evaluate_fit
from tfdist.rundir import RunDir
from tfdist.runtime.placement import Placement
from tfdist.runtime.watchdog import heartbeat_name

rng = np.random.default_rng(0)
X = rng.normal(size=(32, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int64")


def model_fn():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def chief_checkpoints(run_dir: RunDir) -> dict[int, float]:
    """Checkpoints at steps 4 and 8 of a chief (another model each); each one's loss on the validation rows."""
    state = build_state(tf.distribute.get_strategy(), lambda: (lambda m: (m, m.optimizer))(model_fn()),
                        run_dir=run_dir, is_chief=True, task="chief:0")
    losses = {}
    for step in (4, 8):
        state.model.set_weights([w + rng.normal(0, 0.5, w.shape).astype(w.dtype) for w in state.model.get_weights()])
        losses[step] = state.model.evaluate(X, Y, batch_size=8, verbose=0, return_dict=True)["loss"]
        state.step.assign(step)
        state.checkpoints.save(step)
    return losses


#: Seconds the chief of the run of 2 epochs stays up at most, if the evaluator does not return by itself.
STAYS_UP_S = 60


@pytest.mark.parametrize("end", ["last-epoch", "ended-well", "killed"])
def test_an_evaluator_ends_with_the_runs_last_epoch_or_a_chief_that_ended_well_and_fails_with_one_that_died(
        end, tmp_path):
    run_dir = RunDir(tmp_path / "run")
    losses = chief_checkpoints(run_dir)
    heartbeat = run_dir.heartbeats / heartbeat_name("chief:0")
    with socket.socket() as chief:
        chief.bind(("127.0.0.1", 0))
        chief.listen()
        spec = parse_cluster_spec({"chief": f"127.0.0.1:{chief.getsockname()[1]}", "worker": "127.0.0.1:1",
                                   "evaluator": "127.0.0.1:2"}, source="test")
        placement = Placement(strategy="multi_worker_mirrored", traits=strategies.traits("multi_worker_mirrored"),
                              task=Task(spec=spec, type="evaluator", index=0))
        if end == "killed":
            run_dir.heartbeats.mkdir(parents=True)
            heartbeat.write_text(json.dumps({"task": "chief:0"}))
        returned = threading.Event()

        def chief_stops():
            """After both checkpoints are evaluated, or at most STAYS_UP_S in the run of 2 epochs (then a dead
            chief's heartbeat is left, so that an evaluator that missed its last epoch fails)."""
            deadline = time.monotonic() + (STAYS_UP_S if end == "last-epoch" else 120)
            while time.monotonic() < deadline and not returned.is_set() and (
                    end == "last-epoch" or not (run_dir.evaluator_metrics.exists() and
                                                len(run_dir.evaluator_metrics.read_text().splitlines()) == 2)):
                time.sleep(0.1)
            if end == "last-epoch" and not returned.is_set():
                run_dir.heartbeats.mkdir(parents=True, exist_ok=True)
                heartbeat.write_text(json.dumps({"task": "chief:0"}))
            chief.close()

        stopper = threading.Thread(target=chief_stops, daemon=True)
        stopper.start()
        call = lambda: evaluate_fit(model_fn, X, Y, validation_data=(X, Y), placement=placement,  # noqa: E731
                                    model_dir=run_dir.path, batch_size=8, epochs=2 if end == "last-epoch" else 4,
                                    verbose=0)
        try:
            if end == "killed":
                with pytest.raises(RunFailed, match=r"The leader chief:0 at 127\.0\.0\.1:\d+ stopped answering "
                                                    r"before the end of its run\. Received: checkpoints evaluated at "
                                                    r"steps \[4, 8\]"):
                    call()
            else:
                history = call()
        finally:
            returned.set()
            stopper.join(5)
    rows = [json.loads(line) for line in run_dir.evaluator_metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 8]
    for row in rows:
        assert abs(row["val_loss"] - losses[row["step"]]) < 1e-5 * max(1.0, losses[row["step"]]), (row, losses)
    if end != "killed":
        assert history.epoch == [0, 1] and history.history["val_loss"] == [r["val_loss"] for r in rows]
