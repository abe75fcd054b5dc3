"""``tfdist.fit``: the Keras guides' classifier (``examples/fit_classifier.py``) trained under every strategy.

- one process (a fresh one: its 2 logical CPUs are set before TensorFlow
  starts): Keras' own ``model.fit`` on one device, then ``tfdist.fit`` under
  ``one_device``, ``mirrored`` and ``central_storage`` (2 CPUs), all with
  ``shuffle=False`` and the same initial weights. Every epoch's loss, accuracy,
  val_loss and val_accuracy equal Keras' (float rounding: 1e-5), the last
  global batch of each epoch smaller (1000 rows, batch 64), as Keras has it.
  ``EarlyStopping`` stops tfdist.fit at Keras' epoch; a functional model with
  dict inputs and an L2 regularizer on a Dataset of batches equals Keras' too;
  a run resumed from its run directory trains on as the straight run did;
  bad input is one ``UserError`` line.
- the example under ``tfdist.launch``: 2 ``multi_worker_mirrored`` workers
  (both return the same history, equal to one device's to 1e-5; EarlyStopping
  stops both at the same epoch; only worker 0 writes the run's outputs);
  callbacks that change the learning rate or the weights run on both workers,
  which end as one device does, while only the chief writes their files
  (``ModelCheckpoint``, ``CSVLogger``, ``TensorBoard``'s event files, ``BackupAndRestore``) and posts
  (``RemoteMonitor``); a ``BackupAndRestore`` run stopped at an epoch's start and run again resumes there on both
  workers and ends as Keras' uninterrupted fit; chunks that grow (no batch hooks) are the same on both workers,
  even where their clocks want other sizes, and train as one step a chunk does, bit for bit; and
  ``parameter_server`` (a chief, 2 workers, a ps): it learns
  (held-out accuracy far above chance).
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading

import pytest

from helpers.cluster_runs import REPO, Processes, launcher, loopback_cluster, max_difference, npz_weights, shared
from helpers.models import source
from helpers.outputs import tagged

EXAMPLE = REPO / "examples" / "fit_classifier.py"
KEYS = ("loss", "accuracy", "val_loss", "val_accuracy")

IN_ONE_PROCESS = source() + r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tfdist.strategies import setup_host
setup_host(cpu_devices=2)  # before TensorFlow starts: mirrored and central_storage get 2 replicas
import keras
import tfdist
from tfdist.errors import UserError
from fit_classifier import make_data, model_fn

x, y = make_data(1000, seed=0)
val = make_data(200, seed=1)
out = {"keras": model_fn().fit(x, y, batch_size=64, epochs=3, shuffle=False, validation_data=val, verbose=0).history}
for strategy in ("one_device", "mirrored", "central_storage"):
    out[strategy] = tfdist.fit(model_fn, x, y, batch_size=64, epochs=3, shuffle=False, validation_data=val,
                               strategy=strategy, verbose=0).history
stop = lambda: [keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=0)]  # no epoch gains 10
out["keras_stopped"] = model_fn().fit(x, y, batch_size=64, epochs=5, shuffle=False, verbose=0,
                                      callbacks=stop()).history
out["stopped"] = tfdist.fit(model_fn, x, y, batch_size=64, epochs=5, shuffle=False, strategy="mirrored",
                            verbose=0, callbacks=stop()).history
# A functional model with two inputs (a dict), an L2 regularizer and a Dataset of batches of 20 (300 rows).
def regression():
    keras.utils.set_random_seed(3)
    a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3))(
        keras.layers.Concatenate()([a, b]))
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    return model
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
rows = ({"a": rng.random((300, 5), dtype=np.float32), "b": rng.random((300, 3), dtype=np.float32)},
        rng.random((300, 1), dtype=np.float32))
batches = lambda: tf.data.Dataset.from_tensor_slices(rows).batch(20)
out["regression_keras"] = regression().fit(batches(), epochs=2, verbose=0).history
out["regression"] = tfdist.fit(regression, batches(), epochs=2, strategy="mirrored", verbose=0).history
# Resume: 2 epochs into a run directory, then the same call with epochs=3 trains the third only.
run_dir = sys.argv[2]
tfdist.fit(model_fn, x, y, batch_size=64, epochs=2, shuffle=False, strategy="mirrored", verbose=0, model_dir=run_dir)
out["resumed"] = tfdist.fit(model_fn, x, y, batch_size=64, epochs=3, shuffle=False, strategy="mirrored",
                            verbose=0, model_dir=run_dir).history
errors = []
def uncompiled():
    return dense(784, 10, compiled=False)
for kwargs in ({"model_fn": uncompiled, "batch_size": 64}, {"model_fn": model_fn, "batch_size": 63}):
    try:
        tfdist.fit(kwargs.pop("model_fn"), x, y, strategy="mirrored", verbose=0, **kwargs)
    except UserError as e:
        errors.append(str(e))
out["errors"] = errors
print("RESULTS " + json.dumps(out))
"""


def one_process(python, tmp_dir) -> dict:
    """The figures of ``IN_ONE_PROCESS`` (once per session: the cluster tests compare with them)."""
    def make():
        result = python(["-c", IN_ONE_PROCESS, str(REPO / "examples"), str(tmp_dir / "resumed")], timeout=400)
        assert result.returncode == 0, result.stderr[-3000:]
        return tagged(result.stdout, "RESULTS")

    return shared("fit_one_process", make)


def assert_histories_close(got: dict, expected: dict, rtol: float) -> None:
    assert sorted(got) == sorted(expected) == sorted(KEYS), (got, expected)
    for key in KEYS:
        assert len(got[key]) == len(expected[key]), key
        assert got[key] == pytest.approx(expected[key], rel=rtol, abs=1e-7), (key, got[key], expected[key])


@pytest.mark.xdist_group("fit")
def test_fit_equals_keras_fit_on_one_device_and_on_two_replicas(python, tmp_path_factory):
    results = one_process(python, tmp_path_factory.mktemp("fit"))
    assert len(results["keras"]["loss"]) == 3
    for strategy in ("one_device", "mirrored", "central_storage"):
        assert_histories_close(results[strategy], results["keras"], rtol=1e-5)
    assert results["keras"]["loss"][-1] < results["keras"]["loss"][0]  # it learns: there is something to compare
    assert len(results["keras_stopped"]["loss"]) == len(results["stopped"]["loss"]) == 2
    assert results["stopped"]["loss"] == pytest.approx(results["keras_stopped"]["loss"], rel=1e-5)
    # Dict inputs, a regularizer, a Dataset's own batches (each cut in two): as Keras computes it.
    for key in ("loss", "mae"):
        assert results["regression"][key] == pytest.approx(results["regression_keras"][key], rel=1e-5), key
    # The resumed call trains the third epoch only, from the checkpoint of the second: as the straight run did.
    assert len(results["resumed"]["loss"]) == 1
    for key in ("loss", "accuracy"):
        assert results["resumed"][key][0] == pytest.approx(results["mirrored"][key][2], rel=1e-5), key
    uncompiled, odd_batch = results["errors"]
    assert uncompiled.startswith("Invalid model_fn: it must return a compiled keras.Model. Received: a Sequential ")
    assert odd_batch.startswith("Invalid value for `batch_size`. Received: batch_size=63 with 2 replicas.")


def _launched(tmp_path, strategy: str, *flags: str, **tasks: int) -> tuple[int, str]:
    cluster = loopback_cluster(tmp_path / "cluster.yaml", **tasks)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(EXAMPLE), f"--strategy={strategy}",
                                              f"--model_dir={tmp_path / 'run'}", *flags))
        return proc.wait(400), proc.text()


@pytest.mark.xdist_group("fit")
def test_fit_on_two_workers_equals_one_device_and_worker_0_alone_writes(tmp_path, tmp_path_factory, python):
    # 5 epochs asked, but EarlyStopping (on every worker) ends the run after epoch 2: no epoch gains 10 in
    # val_loss. Both workers stop there (neither waits in a collective for the other) with the same history.
    status, text = _launched(tmp_path, "multi_worker_mirrored", "--epochs=5", "--patience=0", "--min_delta=10",
                             worker=2)
    assert status == 0, text[-4000:]
    histories = {task: tagged("\n".join(line[len(f"[{task}] "):] for line in text.splitlines()
                                        if line.startswith(f"[{task}] ")), "HISTORY")
                 for task in ("worker:0", "worker:1")}
    assert histories["worker:0"] == histories["worker:1"]
    one_device = one_process(python, tmp_path_factory.mktemp("fit"))["one_device"]
    assert_histories_close(histories["worker:0"], {k: v[:2] for k, v in one_device.items()}, rtol=1e-5)
    run = tmp_path / "run"
    assert (run / "metrics.jsonl").is_file() and (run / "checkpoints" / "checkpoint").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [16, 32]  # one row an epoch, one writer
    assert not (run / "heartbeats").exists()  # both ended well


def test_fit_under_parameter_server_learns(tmp_path):
    status, text = _launched(tmp_path, "parameter_server", chief=1, worker=2, ps=1)
    assert status == 0, text[-4000:]
    history = tagged("\n".join(line[len("[chief:0] "):] for line in text.splitlines()
                               if line.startswith("[chief:0] ")), "HISTORY")
    assert len(history["loss"]) == 3 and history["loss"][-1] < history["loss"][0], history
    assert history["val_accuracy"][-1] > 0.3, history  # 10 classes: chance is 0.1
    for task in ("worker:0", "worker:1", "ps:0"):
        assert f"[launch] {task} exited with status 0" in text
    assert not (tmp_path / "run" / "fit-inputs").exists()  # the staged input is removed at the end


CALLBACKS_ON_EVERY_WORKER = source() + r"""
import json, os, sys
import numpy as np
import tfdist
tfdist.setup("multi_worker_mirrored")
import keras

out, files, monitor = sys.argv[1], sys.argv[2], sys.argv[3]
task = json.loads(os.environ["TF_CONFIG"])["task"]
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype(np.float32)
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(256, 1))).astype(np.float32)

def model_fn():
    return dense(8, hidden=(16,), activation="tanh", seed=1, optimizer=keras.optimizers.SGD(0.05), metrics=["mae"])

class Decay(keras.callbacks.Callback):  # a user's callback: the learning rate after every batch
    def on_train_batch_end(self, batch, logs=None):
        self.model.optimizer.learning_rate = float(np.asarray(self.model.optimizer.learning_rate)) * 0.99

class Paths(keras.callbacks.Callback):  # where the file-writing callbacks write while fit runs
    def __init__(self, checkpoint, csv, board, backup):
        super().__init__()
        self.checkpoint, self.csv, self.board, self.backup, self.seen = checkpoint, csv, board, backup, None
    def on_epoch_end(self, epoch, logs=None):
        self.seen = [self.checkpoint.filepath, self.csv.filename, self.board.log_dir, self.backup.backup_dir]

def callbacks(directory):
    os.makedirs(directory, exist_ok=True)
    checkpoint = keras.callbacks.ModelCheckpoint(os.path.join(directory, "model-{epoch}.weights.h5"),
                                                 save_weights_only=True)
    csv = keras.callbacks.CSVLogger(os.path.join(directory, "log.csv"), append=True)
    board = keras.callbacks.TensorBoard(os.path.join(directory, "tb"))
    backup = keras.callbacks.BackupAndRestore(os.path.join(directory, "backup"), delete_checkpoint=False)
    # ReduceLROnPlateau: no epoch gains 10, so it halves the rate after every epoch but the first; EarlyStopping
    # counts from epoch 3 and stops after epoch 4, restoring epoch 3's weights.
    return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr if epoch < 1 else lr * 0.7),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0),
            Decay(),
            keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1, start_from_epoch=2,
                                          restore_best_weights=True),
            checkpoint, csv, board, backup, Paths(checkpoint, csv, board, backup)]

def learning_rate(model):
    return float(np.asarray(model.optimizer.learning_rate))

reference = model_fn()
reference_history = reference.fit(x, y, batch_size=32, epochs=6, shuffle=False, verbose=0, validation_data=(x, y),
                                  callbacks=callbacks(os.path.join(out, f"reference-{task['index']}"))).history
given = [keras.callbacks.RemoteMonitor(root=monitor), *callbacks(files)]
history = tfdist.fit(model_fn, x, y, batch_size=32, epochs=6, shuffle=False, verbose=0, validation_data=(x, y),
                     callbacks=given)
np.savez(os.path.join(out, f"weights-{task['index']}.npz"), *history.model.get_weights())
np.savez(os.path.join(out, f"reference-weights-{task['index']}.npz"), *reference.get_weights())
with open(os.path.join(out, f"results-{task['index']}.json"), "w") as f:
    json.dump({"history": history.history, "reference_history": reference_history,
               "learning_rate": learning_rate(history.model), "reference_learning_rate": learning_rate(reference),
               "paths": given[-1].seen}, f)

# BackupAndRestore on 2 workers, stopped by an exception at epoch 2's start and run again: the second run resumes
# there from the chief's backup on both workers, and ends as Keras' own uninterrupted fit on one device.
class Interrupted(Exception):
    pass

class Stop(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise Interrupted(epoch)

whole = model_fn()
whole_loss = whole.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0).history["loss"]
backup_dir = os.path.join(out, "resume-backup")
try:
    tfdist.fit(model_fn, x, y, batch_size=32, epochs=4, shuffle=False, verbose=0,
               callbacks=[keras.callbacks.BackupAndRestore(backup_dir), Stop()])
except Interrupted:
    pass
resumed = tfdist.fit(model_fn, x, y, batch_size=32, epochs=4, shuffle=False, verbose=0,
                     callbacks=[keras.callbacks.BackupAndRestore(backup_dir)])
with open(os.path.join(out, f"resumed-{task['index']}.json"), "w") as f:
    json.dump({"loss": resumed.history["loss"], "whole_loss": whole_loss,
               "weights": max(float(np.abs(a - b).max() / np.abs(b).max())
                              for a, b in zip(resumed.model.get_weights(), whole.get_weights()))}, f)

# Chunks that grow (no callback has batch hooks) against one step a chunk (a batch hook): the steps each call of
# the loop ran, recorded on each worker, and what the two fits end with. Worker 1 wants chunks of 2 ms (its own
# clock proposes about one step a chunk), worker 0 of a quarter second: the workers must agree all the same.
import tfdist.engine.chunks
from tfdist.engine.sync_loop import SyncLoop
if task["index"] == 1:
    tfdist.engine.chunks.CHUNK_SECONDS = 0.002
chunks = []
def recorded(train):
    def record(self, num_steps, *args, **kwargs):
        chunks.append(num_steps)
        return train(self, num_steps, *args, **kwargs)
    return record
SyncLoop.train = recorded(SyncLoop.train)

class EveryBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass

grown = tfdist.fit(model_fn, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
grown_chunks = list(chunks)
stepwise = tfdist.fit(model_fn, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[EveryBatch()])
with open(os.path.join(out, f"chunks-{task['index']}.json"), "w") as f:
    json.dump({"grown": grown.history, "stepwise": stepwise.history, "grown_chunks": grown_chunks,
               "stepwise_chunks": chunks[len(grown_chunks):],
               "weights": max(float(np.abs(a - b).max())
                              for a, b in zip(grown.model.get_weights(), stepwise.model.get_weights()))}, f)
"""


def test_callbacks_run_on_every_worker_and_only_the_chief_writes_their_files(tmp_path):
    # Callbacks that change the learning rate (a schedule, a plateau, a user's batch hook) or the weights
    # (EarlyStopping restoring its best epoch) leave both workers' models as Keras' fit leaves one device's.
    script, out, files = tmp_path / "callbacks.py", tmp_path / "out", tmp_path / "files"
    script.write_text(CALLBACKS_ON_EVERY_WORKER)
    out.mkdir()
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    posts = []

    class Monitor(http.server.BaseHTTPRequestHandler):  # RemoteMonitor's server: it counts the epochs posted
        def do_POST(self):
            posts.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Monitor) as server, Processes(tmp_path) as procs:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script), str(out), str(files),
                                              f"http://127.0.0.1:{server.server_address[1]}"))
        status = proc.wait(300)
        server.shutdown()
    assert status == 0, proc.text()[-4000:]
    assert len(posts) == 4, posts  # an epoch's logs posted once, by the chief
    for index in (0, 1):
        resumed = json.loads((out / f"resumed-{index}.json").read_text())
        assert resumed["loss"] == pytest.approx(resumed["whole_loss"][2:], rel=1e-6), (index, resumed)
        assert resumed["weights"] <= 1e-6, (index, resumed)
    # Grown chunks, the same on both workers (agreed in the steps' all-reduce), train as one step a chunk does.
    chunks = [json.loads((out / f"chunks-{index}.json").read_text()) for index in (0, 1)]
    assert chunks[0]["grown_chunks"] == chunks[1]["grown_chunks"], chunks
    assert sum(chunks[0]["grown_chunks"]) == 16 and max(chunks[0]["grown_chunks"]) >= 2, chunks[0]
    assert chunks[0]["stepwise_chunks"] == [1] * 16, chunks[0]
    for result in chunks:
        assert result["grown"] == result["stepwise"] and result["weights"] == 0.0, result
    results = [json.loads((out / f"results-{index}.json").read_text()) for index in (0, 1)]
    for result in results:
        assert len(result["history"]["loss"]) == len(result["reference_history"]["loss"]) == 4  # stopped alike
        assert sorted(result["history"]) == sorted(result["reference_history"])  # learning_rate included
        for key, values in result["reference_history"].items():
            assert result["history"][key] == pytest.approx(values, rel=1e-6), key
        assert result["learning_rate"] == pytest.approx(result["reference_learning_rate"], rel=1e-6)
    assert results[0]["history"] == results[1]["history"]
    assert results[0]["learning_rate"] == results[1]["learning_rate"] < 0.05 * 0.99 ** 30
    for index in (0, 1):
        weights = npz_weights(out / f"weights-{index}.npz")
        reference = npz_weights(out / f"reference-weights-{index}.npz")
        assert max_difference(weights, reference) <= 1e-6 * max(float(abs(r).max()) for r in reference), index
    # The chief writes the real files; worker 1 wrote into a private directory, removed at its end.
    assert results[0]["paths"] == [str(files / "model-{epoch}.weights.h5"), str(files / "log.csv"), str(files / "tb"),
                                   str(files / "backup")]
    assert all(not path.startswith(str(files)) for path in results[1]["paths"]), results[1]["paths"]
    assert not any(os.path.exists(os.path.dirname(path)) for path in results[1]["paths"])
    assert sorted(p.name for p in files.iterdir()) == (["backup", "log.csv"]
                                                       + [f"model-{e}.weights.h5" for e in range(1, 5)] + ["tb"])
    assert len((files / "log.csv").read_text().splitlines()) == 1 + 4  # a header and an epoch a row: one writer
    # TensorBoard: one event file in each of its directories, the chief's (as Keras' fit on one device writes).
    for part in ("train", "validation"):
        assert len(list((files / "tb" / part).glob("events.out.tfevents.*"))) == 1, part
    assert sorted(p.name for p in (files / "backup").iterdir()) == ["latest.weights.h5", "training_metadata.json"]
