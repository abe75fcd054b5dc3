"""``tfdist.fit``'s data order, its resume after a preemption, and its callbacks on every worker.

- The order, read from ``fitting.inputs.Source.dataset_fns`` with the row numbers as
  the feature (a batch shows its rows): with ``shuffle=True`` each epoch is the
  permutation of every row that Keras' ``fit`` reads under TensorFlow's global
  seed (the same each epoch, as Keras' epochs read it), else a function of ``seed``;
  two input pipelines (two workers) each cut their slice of the same global
  batch; a pipeline started at step ``k`` reads the batches a straight one
  reads from its ``k``-th on.
- A run preempted mid-epoch by a callback's own SIGTERM (no race: the signal
  is sent at a chosen batch, inside the run) ends with status 42 and its
  ``Preempted at step N`` line; the same command resumes at step N and its
  per-epoch losses are those of a straight run, the interrupted epoch's too
  (a checkpoint carries the sums of the epoch's steps so far; one written
  without them still restores).
- Under 2 ``multi_worker_mirrored`` workers a callback that writes one file
  per call (named after its task, in a directory of the test's) is called on
  every worker, each call once.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers.cluster_runs import Processes, launcher, loopback_cluster
from helpers.models import source
from helpers.outputs import tagged
from tfdist.fitting.inputs import Source

ROWS, BATCH = 36, 8  # 5 batches an epoch, the last of 4 rows
STEPS = -(-ROWS // BATCH)


def global_batches(steps: int, *, pipelines: int = 1, replicas: int = 1, **kwargs) -> list[list[int]]:
    """The rows of each of the first ``steps`` global batches: every pipeline's replica slices, in order."""
    x = np.arange(ROWS, dtype=np.int64)
    fn, _ = Source.of(x, x).dataset_fns(batch_size=BATCH, training=True, **kwargs)
    per_pipeline = []
    for i in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=i,
                                             num_replicas_in_sync=replicas)
        slices = [part[0].numpy().tolist() for part in fn(context).take(steps * replicas // pipelines)]
        local = replicas // pipelines  # each step: this pipeline's replicas' slices, one after the other
        per_pipeline.append([[row for part in slices[s * local:(s + 1) * local] for row in part] for s in range(steps)])
    return [[row for rows in per_pipeline for row in rows[s]] for s in range(steps)]


def epochs(batches: list[list[int]]) -> list[list[int]]:
    return [[row for batch in batches[e * STEPS:(e + 1) * STEPS] for row in batch]
            for e in range(len(batches) // STEPS)]


@pytest.fixture
def global_seed():
    """``tf.random.set_seed``, reset to none afterwards (none before the test either)."""
    tf.random.set_seed(None)
    yield tf.random.set_seed
    tf.random.set_seed(None)


def keras_fit_reads(global_seed: int, epochs: int) -> list[list[int]]:
    """The rows of each epoch of Keras' own ``fit`` (one device, ``shuffle=True``) under the global seed."""
    import keras

    read = []

    class Reader(keras.Model):
        def train_step(self, data):
            tf.py_function(lambda rows: read.append(rows.numpy()[:, 0].tolist()) or 0, [data[0]], tf.int64)
            return {"read": tf.constant(0.0)}

    keras.utils.set_random_seed(global_seed)
    inputs = keras.Input((1,), dtype="int64")
    model = Reader(inputs, inputs)
    model.compile(optimizer="sgd")
    x = np.arange(ROWS, dtype=np.int64)[:, None]
    model.fit(x, x, batch_size=BATCH, epochs=epochs, verbose=0)
    return [[row for batch in read[e * STEPS:(e + 1) * STEPS] for row in batch] for e in range(epochs)]


def test_a_shuffled_epoch_is_keras_order_of_every_row_the_same_each_epoch(global_seed):
    global_seed(3)
    read = epochs(global_batches(3 * STEPS, shuffle=True, seed=5))
    assert [len(b) for b in global_batches(STEPS, shuffle=True, seed=5)] == [8, 8, 8, 8, 4]
    assert sorted(read[0]) == list(range(ROWS)) and read[0] != list(range(ROWS))  # every row once, shuffled
    assert read[0] == read[1] == read[2]  # as Keras' epochs read it: one seeded permutation
    assert read == keras_fit_reads(3, 3)


def test_without_a_global_seed_the_order_is_a_function_of_the_seed(global_seed):
    assert global_batches(2 * STEPS, shuffle=True, seed=5) == global_batches(2 * STEPS, shuffle=True, seed=5)
    assert global_batches(2 * STEPS, shuffle=True, seed=5) != global_batches(2 * STEPS, shuffle=True, seed=6)


@pytest.mark.parametrize("replicas", [2, 4])
def test_two_workers_cut_their_slices_of_one_global_order(replicas):
    one = global_batches(2 * STEPS, shuffle=True, seed=5)
    # Two pipelines (workers), each with replicas / 2 replicas: the slices, in replica order, are the global batch.
    assert global_batches(2 * STEPS, pipelines=2, replicas=replicas, shuffle=True, seed=5) == one
    assert global_batches(2 * STEPS, pipelines=1, replicas=replicas, shuffle=True, seed=5) == one


@pytest.mark.parametrize("start_step", [1, STEPS + 2, 2 * STEPS])
def test_a_pipeline_started_at_a_step_reads_the_straight_batches_from_there(start_step):
    straight = global_batches(3 * STEPS, shuffle=True, seed=5)
    resumed = global_batches(3 * STEPS - start_step, shuffle=True, seed=5, start_step=start_step)
    assert resumed == straight[start_step:]
    two_workers = global_batches(3 * STEPS - start_step, pipelines=2, replicas=2, shuffle=True, seed=5,
                                 start_step=start_step)
    assert two_workers == straight[start_step:]


def test_a_checkpoint_carries_the_log_window_and_one_without_it_still_restores(tmp_path):
    from tfdist.engine.checkpoints import Checkpoints
    from tfdist.rundir import RunDir

    run_dir = RunDir(tmp_path / "run")
    run_dir.checkpoints.mkdir(parents=True)
    tf.train.Checkpoint(step=tf.Variable(7, dtype=tf.int64)).save(str(run_dir.checkpoints / "ckpt"))  # no window
    step = tf.Variable(0, dtype=tf.int64)
    first = Checkpoints(checkpoint=tf.train.Checkpoint(step=step), run_dir=run_dir, is_chief=True)
    assert first.restore_latest() and int(step.numpy()) == 7 and first.restored_window().size == 0
    first.save(9, [1.5, 2.0, 0.25])
    again = Checkpoints(checkpoint=tf.train.Checkpoint(step=step), run_dir=run_dir, is_chief=True)
    assert again.restore_latest().endswith("ckpt-9")
    assert again.restored_window().tolist() == [1.5, 2.0, 0.25]


#: A small regression under ``tfdist.fit``, ``shuffle=True``; argv: model_dir, the global step after which a
#: callback sends SIGTERM to its own process (-1: never), and "batch" or "epoch": the callback's hook. The
#: preemption then stops the run after the next chunk (with a batch hook: the next step), saves that step and
#: ends the process with status 42. With an epoch hook alone (signal_after at an epoch's end) chunks grow.
PREEMPTED = source() + r"""
import json, os, signal, sys
import numpy as np
import keras
import tfdist

model_dir, signal_after, hook = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ROWS, BATCH = 36, 8
STEPS = -(-ROWS // BATCH)


class SignalOnce(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch * STEPS + batch + 1 == signal_after:
            os.kill(os.getpid(), signal.SIGTERM)


class SignalAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) * STEPS == signal_after:
            os.kill(os.getpid(), signal.SIGTERM)


def model_fn():
    return dense(hidden=(8,), seed=1, optimizer=keras.optimizers.SGD(0.05))


rng = np.random.default_rng(0)
x = rng.normal(size=(ROWS, 4)).astype(np.float32)
y = (x @ rng.normal(size=(4, 1)) + 0.1 * rng.normal(size=(ROWS, 1))).astype(np.float32)
history = tfdist.fit(model_fn, x, y, batch_size=BATCH, epochs=3, shuffle=True, seed=5, model_dir=model_dir,
                     callbacks=[SignalOnce() if hook == "batch" else SignalAtEpochEnd()])
print("HISTORY " + json.dumps(history.history), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["batch", "epoch"])
def test_a_run_preempted_mid_epoch_resumes_at_its_step_with_the_straight_runs_losses(tmp_path, hook):
    script = tmp_path / "preempted.py"
    script.write_text(PREEMPTED)
    signal_after = STEPS + 2 if hook == "batch" else STEPS  # the third batch of the second epoch, or its start
    with Processes(tmp_path) as procs:
        straight = procs.start("straight", [sys.executable, str(script), str(tmp_path / "straight"), "-1", hook])
        preempted = procs.start("preempted", [sys.executable, str(script), str(tmp_path / "run"), str(signal_after),
                                              hook])
        assert straight.wait(400) == 0, straight.text()[-3000:]
        assert preempted.wait(400) == 42, preempted.text()[-3000:]
        resumed = procs.start("resumed", [sys.executable, str(script), str(tmp_path / "run"), "-1", hook])
        assert resumed.wait(400) == 0, resumed.text()[-3000:]
    # The signal arrives during the callback after step signal_after; the next chunk carries the vote: one step
    # with a batch hook, else a grown chunk, which an epoch's end cuts.
    reached = int(re.search(r"^error: Preempted at step (\d+) of 15: local received SIGTERM\. ", preempted.text(),
                            re.MULTILINE).group(1))
    if hook == "batch":
        assert reached == signal_after + 1, preempted.text()[-3000:]
    assert STEPS < reached < 2 * STEPS or (hook == "epoch" and reached == 2 * STEPS), preempted.text()[-3000:]
    assert "HISTORY" not in preempted.text()  # fit did not return
    assert re.search(rf"resuming from \S+/ckpt-{reached} at step {reached}\n", resumed.text()), resumed.text()[-3000:]
    expected, got = tagged(straight.text(), "HISTORY")["loss"], tagged(resumed.text(), "HISTORY")["loss"]
    # The resumed call reports the epochs it ended: the interrupted one (over all its batches, those before the
    # preemption included; none where a chunk ended with the epoch) and the last. The same batches on the same
    # weights in the same order give the same float32 steps (measured: equal to the last bit, loaded machine or
    # not); one batch of another order or an epoch's loss over part of its batches differs by 1e-2 or more.
    assert len(got) == 3 - reached // STEPS, got
    assert got == pytest.approx(expected[reached // STEPS:], rel=1e-6), (got, expected)


#: Two epochs of 4 steps under ``tfdist.fit`` (the strategy from argv), with a callback that appends one line per
#: call to a file named after this task (from TF_CONFIG), the call and its epoch or batch, in a shared directory.
CALLBACKS = source() + r"""
import json, os, sys
import numpy as np
import keras
import tfdist

strategy, model_dir, files = sys.argv[1], sys.argv[2], sys.argv[3]
task = json.loads(os.environ["TF_CONFIG"])["task"]
me = f"{task['type']}{task['index']}"


class Files(keras.callbacks.Callback):
    def _write(self, *name):
        with open(os.path.join(files, ".".join(map(str, (me, *name)))), "a") as f:
            f.write("called\n")

    def on_train_begin(self, logs=None):
        self._write("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._write("epoch_begin", epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._write("batch_end", self.epoch, batch)

    def on_epoch_end(self, epoch, logs=None):
        self._write("epoch_end", epoch)

    def on_train_end(self, logs=None):
        self._write("train_end")


def model_fn():
    return dense(seed=1, optimizer=keras.optimizers.SGD(0.05))


x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
history = tfdist.fit(model_fn, x, x[:, :1], batch_size=8, epochs=2, shuffle=True, seed=5, strategy=strategy,
                     model_dir=model_dir, callbacks=[Files()], verbose=0)
print("HISTORY " + json.dumps(history.history), flush=True)
"""


@pytest.mark.slow
def test_callbacks_run_on_every_worker_once_per_call(tmp_path):
    script, files = tmp_path / "callbacks.py", tmp_path / "files"
    script.write_text(CALLBACKS)
    files.mkdir()
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script), "multi_worker_mirrored",
                                              str(tmp_path / "run"), str(files)))
        status, text = proc.wait(400), proc.text()
    assert status == 0, text[-4000:]
    assert "[worker:0] HISTORY" in text and "[worker:1] HISTORY" in text  # both trained to the end
    expected = []
    for me in ("worker0", "worker1"):  # as Keras 2's multi-worker fit ran them: every worker, the same calls
        expected += [f"{me}.train_begin", f"{me}.train_end"]
        for epoch in range(2):
            expected += [f"{me}.epoch_begin.{epoch}", f"{me}.epoch_end.{epoch}"]
            expected += [f"{me}.batch_end.{epoch}.{batch}" for batch in range(4)]
    assert sorted(p.name for p in files.iterdir()) == sorted(expected)
    for path in files.iterdir():
        assert path.read_text() == "called\n", path.name  # each call once
