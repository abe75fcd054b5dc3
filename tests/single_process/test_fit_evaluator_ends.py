"""How ``tfdist.fit``'s side-car evaluator ends when the chief stops before the run's last step, in this process.

The chief's checkpoints of epochs 1 and 2 are written here in its layout (``build_state``), and a listening
socket stands for the chief. In a run of 2 epochs the evaluator returns after the second, the chief still up.
In a run of 4, once the evaluator has evaluated both, the socket closes: a chief that ended well (a callback's
``stop_training``) removed its heartbeat, and the evaluator returns what it evaluated; a chief whose heartbeat
is left (killed, preempted) ends the evaluator with ``RunFailed``. A model with its own ``test_step`` is
evaluated on each checkpoint as Keras' ``evaluate`` of its weights.
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
from tfdist.fitting.api import KerasClient
from tfdist.fitting.inputs import Source
from tfdist.rundir import RunDir
from tfdist.runtime import driver
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


class OwnTestStep(keras.Sequential):
    """A model with its own ``test_step``, as the keras.io guide writes one."""

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        for metric in self.metrics:
            metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, y_pred)
        return {metric.name: metric.result() for metric in self.metrics}


def own_model_fn():
    model = OwnTestStep([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def chief_checkpoints(run_dir: RunDir, make=model_fn) -> dict[int, dict]:
    """Checkpoints at steps 4 and 8 of a chief (another model each); Keras' ``evaluate`` of each on the
    validation rows."""
    state = build_state(tf.distribute.get_strategy(), lambda: (lambda m: (m, m.optimizer))(make()),
                        run_dir=run_dir, is_chief=True, task="chief:0")
    evaluated = {}
    for step in (4, 8):
        state.model.set_weights([w + rng.normal(0, 0.5, w.shape).astype(w.dtype) for w in state.model.get_weights()])
        evaluated[step] = state.model.evaluate(X, Y, batch_size=8, verbose=0, return_dict=True)
        state.step.assign(step)
        state.checkpoints.save(step)
    return evaluated


def evaluator_placement(chief: socket.socket) -> Placement:
    """An evaluator task whose chief is the listening ``chief``."""
    spec = parse_cluster_spec({"chief": f"127.0.0.1:{chief.getsockname()[1]}", "worker": "127.0.0.1:1",
                               "evaluator": "127.0.0.1:2"}, source="test")
    return Placement(strategy="multi_worker_mirrored", traits=strategies.traits("multi_worker_mirrored"),
                     task=Task(spec=spec, type="evaluator", index=0))


def evaluate_fit(make, placement: Placement, run_dir: RunDir, *, epochs: int):
    """``tfdist.fit(make, X, Y, batch_size=8, epochs=epochs, validation_data=(X, Y), verbose=0)`` on the evaluator
    task ``placement``, once started: the driver's evaluator run of its client."""
    client = KerasClient(make, Source.of(X, Y), Source.of(X, Y), batch_size=8, epochs=epochs, validation_freq=1,
                         steps_per_epoch=None, validation_steps=None, shuffle=True, initial_epoch=0, callbacks=None,
                         verbose=0, class_weight=None, seed=None, connect_timeout=120.0)
    return driver.evaluate(client, placement, run_dir, connect_timeout=120.0, verbose=False)


def test_a_models_own_test_step_evaluates_each_checkpoint_as_keras_evaluate(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    expected = chief_checkpoints(run_dir, own_model_fn)
    with socket.socket() as chief:
        chief.bind(("127.0.0.1", 0))
        chief.listen()
        history = evaluate_fit(own_model_fn, evaluator_placement(chief), run_dir, epochs=2)
    assert history.epoch == [0, 1]
    for name in ("loss", "accuracy"):  # its metrics reset before each checkpoint, as Keras' evaluate resets them
        got, want = history.history[f"val_{name}"], [expected[step][name] for step in (4, 8)]
        assert np.allclose(got, want, rtol=1e-6, atol=0), (name, got, want)


#: Seconds the chief of the run of 2 epochs stays up at most, if the evaluator does not return by itself.
STAYS_UP_S = 60


@pytest.mark.parametrize("end", ["last-epoch", "ended-well", "killed"])
def test_an_evaluator_ends_with_the_runs_last_epoch_or_a_chief_that_ended_well_and_fails_with_one_that_died(
        end, tmp_path):
    run_dir = RunDir(tmp_path / "run")
    losses = {step: result["loss"] for step, result in chief_checkpoints(run_dir).items()}
    heartbeat = run_dir.heartbeats / heartbeat_name("chief:0")
    with socket.socket() as chief:
        chief.bind(("127.0.0.1", 0))
        chief.listen()
        placement = evaluator_placement(chief)
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
        call = lambda: evaluate_fit(model_fn, placement, run_dir, epochs=2 if end == "last-epoch" else 4)  # noqa: E731
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
