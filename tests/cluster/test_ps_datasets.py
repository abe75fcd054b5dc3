"""Datasets that repeat without end, or of unknown length, under ``parameter_server``: one cluster of real
processes on 127.0.0.1 (a chief, 2 workers and a ps under ``tfdist.launch --local``) runs one script:

- TensorFlow's parameter-server tutorial, its ``Model.fit`` part, with tfdist's one line:
  ``dataset.shuffle(10).repeat()`` with ``steps_per_epoch`` trains to its end with the loss falling, its
  checkpoint reloads and predicts as the model does, Keras' ``evaluate`` gives the loss of its predictions
  (each example once), and the files are the chief's alone;
- after the fits, the tutorial's custom training loop (``ClusterCoordinator``, ``schedule``, ``join``) and
  inline evaluation run on the same servers to their end: the ps and workers serve the whole script and end
  with its status;
- ``tfdist.fit`` with a Dataset that repeats, and with one of unknown length (``.filter``), trains as many
  epochs as asked and leaves no stage behind; without ``steps_per_epoch`` the latter is one line;
- a stage over ``TFDIST_STAGE_LIMIT`` is one line naming its size, from Keras' ``fit`` too;
- last, a SIGTERM to the chief while it stages a large input ends it as a preemption does (status 42, one
  ``error: Preempted`` line, the cluster stopped), within the grace period, with no stage left that could
  be taken for a complete one.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time

import pytest

from helpers.cluster_runs import Processes, assert_none_left, every_started_pid, launcher, loopback_cluster, started_pids
from helpers.models import source
from tfdist.errors import PREEMPTED_EXIT_CODE

#: A preempted task must be gone well within Kubernetes' default grace period (30 s).
GRACE_S = 30

SCRIPT = source() + r'''
import json, os, sys, time
import tfdist
strategy = tfdist.setup("parameter_server")
import numpy as np, keras, tensorflow as tf

work = sys.argv[1]
out = {}

# TensorFlow's parameter-server tutorial, Model.fit part, in Keras 3: its names, a Dataset where it had a
# DatasetCreator, and targets of shape (10, 1) (Keras 3's mse does not expand (64,) against (64, 10)).
global_batch_size = 64
x = tf.random.uniform((10, 10))
y = tf.random.uniform((10, 1))
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
dataset = dataset.batch(global_batch_size)
dataset = dataset.prefetch(2)
with strategy.scope():
    model = keras.models.Sequential([keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(), loss="mse", steps_per_execution=10)
working_dir = os.path.join(work, "my_working_dir")
ckpt_filepath = os.path.join(working_dir, "ckpt.keras")
callbacks = [
    keras.callbacks.TensorBoard(log_dir=os.path.join(working_dir, "log")),
    keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
    keras.callbacks.BackupAndRestore(backup_dir=os.path.join(working_dir, "backup")),
]
history = model.fit(dataset, epochs=5, steps_per_epoch=20, callbacks=callbacks)
out["tutorial"] = history.history["loss"]
restored = keras.models.load_model(ckpt_filepath)
out["predict_equal"] = bool(np.array_equal(restored.predict(x, verbose=0), model.predict(x, verbose=0)))
# Exactly-once evaluation: Keras 3 has no compile(pss_evaluation_shards=...); the coordinator evaluates each
# example once itself.
mse = float(np.mean((model.predict(x, verbose=0) - y.numpy()) ** 2))
out["evaluate"] = [model.evaluate(x, y, verbose=0), mse]

def model_fn():
    return dense(10, optimizer=keras.optimizers.SGD(0.1))

pairs = tf.data.Dataset.from_tensor_slices((x, y))
for name, data, steps in (("repeats", pairs.shuffle(10).repeat().batch(4), 5),
                          ("filtered", pairs.filter(lambda a, b: b[0] >= 0).batch(4), 3)):
    run = os.path.join(work, name)
    h = tfdist.fit(model_fn, data, epochs=3, steps_per_epoch=steps, strategy=strategy, model_dir=run, verbose=0)
    out[name] = {"loss": h.history["loss"], "steps": int(h.model.optimizer.iterations.numpy()),
                 "left": sorted(p for p in os.listdir(run) if p.startswith("fit-inputs"))}

def refused(call):
    try:
        call()
    except tfdist.errors.UserError as e:
        return str(e)

out["unknown_no_steps"] = refused(lambda: tfdist.fit(model_fn, pairs.filter(lambda a, b: b[0] >= 0).batch(4),
                                                      epochs=1, strategy=strategy, verbose=0))
os.environ["TFDIST_STAGE_LIMIT"] = "20000"
out["over_limit"] = refused(lambda: model.fit(dataset, epochs=5, steps_per_epoch=20))
del os.environ["TFDIST_STAGE_LIMIT"]

# The tutorial's custom training loop and inline evaluation, after the fits, on the same servers: its code as
# written but for Keras 3 (no optimizers.legacy, reset_state for reset_states, keras.ops.mean on a KerasTensor,
# the lookup layers where it calls a functional model on one unbatched example) and the RemoteValues kept.
import random
random.seed(0)
feature_vocab = [
    "avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"
]
label_vocab = ["yes", "no"]

with strategy.scope():
  feature_lookup_layer = tf.keras.layers.StringLookup(vocabulary=feature_vocab, mask_token=None)
  label_lookup_layer = tf.keras.layers.StringLookup(vocabulary=label_vocab, num_oov_indices=0, mask_token=None)

def feature_and_label_gen(num_examples=200):
  examples = {"features": [], "label": []}
  for _ in range(num_examples):
    features = random.sample(feature_vocab, 3)
    label = ["yes"] if "avenger" in features else ["no"]
    examples["features"].append(features)
    examples["label"].append(label)
  return examples

examples = feature_and_label_gen()

def dataset_fn(_):
  raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
  train_dataset = raw_dataset.map(
      lambda x: (
          {"features": feature_lookup_layer(x["features"])},
          label_lookup_layer(x["label"])
      )).shuffle(200).batch(32).repeat()
  return train_dataset

with strategy.scope():
  model_input = tf.keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
  emb_layer = tf.keras.layers.Embedding(input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
  emb_output = tf.keras.ops.mean(emb_layer(model_input), axis=1)
  dense_output = tf.keras.layers.Dense(
      units=1, activation="sigmoid", kernel_regularizer=tf.keras.regularizers.L2(1e-4))(emb_output)
  model = tf.keras.Model({"features": model_input}, dense_output)
  optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.1)
  accuracy = tf.keras.metrics.Accuracy()

@tf.function
def step_fn(iterator):
  def replica_fn(batch_data, labels):
    with tf.GradientTape() as tape:
      pred = model(batch_data, training=True)
      per_example_loss = tf.keras.losses.BinaryCrossentropy(
          reduction=tf.keras.losses.Reduction.NONE)(labels, pred)
      loss = tf.nn.compute_average_loss(per_example_loss)
      model_losses = model.losses
      if model_losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
    accuracy.update_state(labels, actual_pred)
    return loss

  batch_data, labels = next(iterator)
  losses = strategy.run(replica_fn, args=(batch_data, labels))
  return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

@tf.function
def per_worker_dataset_fn():
  return strategy.distribute_datasets_from_function(dataset_fn)

per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)
num_epochs = 4
steps_per_epoch = 5
scheduled, accuracies = [], []
for i in range(num_epochs):
  accuracy.reset_state()
  for _ in range(steps_per_epoch):
    scheduled.append(coordinator.schedule(step_fn, args=(per_worker_iterator,)))
  coordinator.join()
  print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()))
  accuracies.append(float(accuracy.result().numpy()))
loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
print("Final loss is %f" % loss.fetch())

eval_dataset = tf.data.Dataset.from_tensor_slices(feature_and_label_gen(num_examples=16)).map(
    lambda x: ({"features": feature_lookup_layer(x["features"])}, label_lookup_layer(x["label"]))).batch(8)
eval_accuracy = tf.keras.metrics.Accuracy()
for batch_data, labels in eval_dataset:
  pred = model(batch_data, training=False)
  eval_accuracy.update_state(labels, tf.cast(tf.greater(pred, 0.5), tf.int64))
local_accuracy = float(eval_accuracy.result())

with strategy.scope():
  eval_accuracy = tf.keras.metrics.Accuracy()

@tf.function
def eval_step(iterator):
  def replica_fn(batch_data, labels):
    pred = model(batch_data, training=False)
    actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
    eval_accuracy.update_state(labels, actual_pred)
  batch_data, labels = next(iterator)
  strategy.run(replica_fn, args=(batch_data, labels))

def eval_dataset_fn():
  return tf.data.Dataset.from_tensor_slices(feature_and_label_gen(num_examples=16)).map(
      lambda x: ({"features": feature_lookup_layer(x["features"])}, label_lookup_layer(x["label"]))
  ).shuffle(16).repeat().batch(8)

per_worker_eval_iterator = iter(coordinator.create_per_worker_dataset(eval_dataset_fn))
eval_steps_per_epoch = 2
for _ in range(eval_steps_per_epoch):
  coordinator.schedule(eval_step, args=(per_worker_eval_iterator,))
coordinator.join()
distributed_accuracy = float(eval_accuracy.result())
# "The create_per_worker_dataset API can also directly take a tf.data.Dataset or tf.distribute.DistributedDataset".
def accuracy_over(data):
  with strategy.scope():
    metric = tf.keras.metrics.Accuracy()

  @tf.function
  def step(iterator):
    def replica_fn(batch_data, labels):
      metric.update_state(labels, tf.cast(tf.greater(model(batch_data, training=False), 0.5), tf.int64))
    strategy.run(replica_fn, args=next(iterator))

  iterator = iter(coordinator.create_per_worker_dataset(data))
  for _ in range(eval_steps_per_epoch):
    coordinator.schedule(step, args=(iterator,))
  coordinator.join()
  return float(metric.result())

given = {"dataset": accuracy_over(eval_dataset.repeat()),
         "distributed": accuracy_over(strategy.experimental_distribute_dataset(eval_dataset.repeat()))}
out["custom_loop"] = {"accuracy": accuracies, "scheduled": [float(v.fetch()) for v in scheduled],
                      "final_loss": float(loss.fetch()), "local_accuracy": local_accuracy,
                      "distributed_accuracy": distributed_accuracy, **given}
print("RESULT " + json.dumps(out), flush=True)

# Large and slow to stage (1.1 MB a batch, 100 batches a second at most): the test sends SIGTERM meanwhile.
def slow(i):
    time.sleep(0.01)
    return i

big = (tf.data.Dataset.range(10 ** 6).map(lambda i: tf.py_function(slow, [i], tf.int64))
       .map(lambda j: (tf.zeros([25600, 10]), tf.zeros([25600, 1]))).filter(lambda a, b: True))
tfdist.fit(model_fn, big, epochs=1, steps_per_epoch=10 ** 6, strategy=strategy,
           model_dir=os.path.join(work, "preempted"), verbose=0)
print("NOT PREEMPTED", flush=True)
'''


def test_the_tutorials_repeat_and_steps_per_epoch_train_and_staging_is_bounded_and_preemptible(tmp_path):
    script = tmp_path / "ps_datasets.py"
    script.write_text(SCRIPT)
    cluster = loopback_cluster(tmp_path / "cluster.yaml", chief=1, worker=2, ps=1)
    work = tmp_path / "work"
    work.mkdir()
    command = launcher(cluster, sys.executable, str(script), str(work), options=(f"--grace_seconds={GRACE_S}",))
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", command)
        proc.wait_for(lambda t: "tfdist: staged " in t, 400, "a progress line of the large stage")
        chief = started_pids(proc.text())["chief:0"]
        sent = time.monotonic()
        os.kill(chief, signal.SIGTERM)  # the chief alone, as a scheduler preempts one task
        status, took = proc.wait(GRACE_S + 30), time.monotonic() - sent
    text = proc.text()
    assert_none_left(every_started_pid(text))
    result = json.loads(re.search(r"^\[chief:0\] RESULT (.*)$", text, re.M).group(1))
    # The tutorial trains to its end, the loss falling; its checkpoint predicts as the model does.
    loss = result["tutorial"]
    assert len(loss) == 5 and loss[-1] < 0.8 * loss[0], loss
    assert result["predict_equal"] is True
    assert result["evaluate"][0] == pytest.approx(result["evaluate"][1], rel=1e-5), result["evaluate"]
    assert "[chief:0] tfdist: the Dataset x repeats without end: its first 100 batches, one for each step up " \
           "to step 100" in text
    # The callbacks' files, the chief's alone (BackupAndRestore removes its backup at the end of a fit).
    assert sorted(p.name for p in (work / "my_working_dir").iterdir()) == ["ckpt.keras", "log"]
    # tfdist.fit: a Dataset that repeats and one of unknown length train their epochs; no stage is left.
    # Three epochs of the steps asked, every one applied (the workers' updates are asynchronous, so one
    # epoch's mean loss may rise over a few steps: the count of updates is what is exact here).
    for name, steps in (("repeats", 5), ("filtered", 3)):
        assert len(result[name]["loss"]) == 3 and all(0 <= v < 10 for v in result[name]["loss"]), result
        assert result[name]["steps"] == 3 * steps, result
        assert result[name]["left"] == [], result
    assert result["unknown_no_steps"].startswith("Missing `steps_per_epoch`."), result
    # The tutorial's custom training loop and inline evaluation, after the fits, on the same servers: each of
    # the 20 steps scheduled returned its loss (finite; its RMSprop at 0.1 overshoots on the way, by hundreds at
    # times, in plain TensorFlow too), and the model learned the toy rule (a feature list holds "avenger";
    # always "no" would score about 0.57). The metrics are Keras' own, read on the chief.
    loop = result["custom_loop"]
    assert len(loop["scheduled"]) == 20 and all(0 < v < math.inf for v in loop["scheduled"]), loop
    assert len(loop["accuracy"]) == 4 and loop["accuracy"][-1] >= 0.8, loop
    assert 0 < loop["final_loss"] < 0.6, loop
    assert min(loop[k] for k in ("local_accuracy", "distributed_accuracy", "dataset", "distributed")) >= 0.8, loop
    assert "[chief:0] Finished epoch 3, accuracy is " in text and "[chief:0] Final loss is " in text
    # The tutorial's batches leave their size open in the Dataset's type (no drop_remainder), and the Dataset is
    # not read before training: the limit stops the stage as it is written.
    assert result["over_limit"].startswith(
        "Invalid `x` under parameter_server: the first 100 batches of the Dataset x must be staged on disk for "
        "the workers, and its stage reached "), result
    assert "before its end, over the staging limit of 19.5 KiB (TFDIST_STAGE_LIMIT=20000)." in result["over_limit"]
    # SIGTERM while staging: a preemption's end, at once, and nothing staged left behind.
    assert status == PREEMPTED_EXIT_CODE and took < GRACE_S, (status, took, text[-4000:])
    assert re.search(r"^\[chief:0\] error: Preempted: chief:0 received SIGTERM before its first step", text, re.M), \
        text[-4000:]
    assert "[launch] chief:0 exited with status 42" in text and "NOT PREEMPTED" not in text
    # The ps and workers served the whole script, its fits and its own coordinator, and ended with its status:
    # the ps, which serves through a SIGTERM, says so.
    assert re.search(r"^\[ps:0\] tfdist: ps:0 at \S+: chief:0 ended with status 42 ", text, re.M), text[-4000:]
    assert all(f"[launch] {task} exited with status 42" in text for task in ("ps:0", "worker:0", "worker:1")), \
        text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    assert not [p.name for p in (work / "preempted").iterdir() if p.name.startswith("fit-inputs")]
    # Nor the status the chief told its servers (in the tasks' temporary directory, the test's).
    assert not list(tmp_path.glob("tfdist-*.status"))



ENDS_REFUSED = source() + r'''
import tfdist
strategy = tfdist.setup("parameter_server")
import tensorflow as tf

x, y = tf.random.uniform((10, 4)), tf.random.uniform((10, 1))
history = tfdist.fit(lambda: dense(4, 1), x, y, batch_size=5, epochs=1, strategy=strategy, verbose=0)
print(f"FIT ENDED {len(history.history['loss'])}", flush=True)
tfdist.fit(lambda: dense(4, 1), tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(5),
           epochs=1, strategy=strategy, verbose=0)  # no steps_per_epoch: a UserError the script leaves uncaught
'''


def test_a_script_that_a_user_error_ends_after_a_fit_ends_its_serving_tasks_with_status_2(tmp_path):
    # The servers outlive the first fit and learn the script's status from the chief's exception hook,
    # before tfdist's one-line hook ends the process.
    script = tmp_path / "ends_refused.py"
    script.write_text(ENDS_REFUSED)
    cluster = loopback_cluster(tmp_path / "cluster.yaml", chief=1, worker=1, ps=1)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script),
                                              options=(f"--grace_seconds={GRACE_S}",)))
        status, text = proc.wait(300), proc.text()
    assert status == 2, text[-4000:]
    assert "[chief:0] FIT ENDED 1" in text
    errors = [line for line in text.splitlines() if line.startswith("[chief:0] error: ")]
    assert len(errors) == 1 and errors[0].startswith("[chief:0] error: Missing `steps_per_epoch`."), text[-4000:]
    assert re.search(r"^\[ps:0\] tfdist: ps:0 at \S+: chief:0 ended with status 2 ", text, re.M), text[-4000:]
    assert "[launch] ps:0 exited with status 2" in text and "stopped answering" not in text, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    assert_none_left(every_started_pid(text))
