"""A script's saves, each followed at once by its load, on every worker after ``tfdist.setup`` (argv: the folder).

Every listed save call writes a fresh path in the folder, then every worker loads it right away and prints what it
read as one ``RESULTS`` JSON line: the weight ``tag`` the file holds (each worker sets its own before saving:
1000 plus its index, so the file says who wrote it), whether the reload predicts what was saved, and the path a
save returned. The chief's saves start 3 s late (a slow write), so a worker that did not wait for them would find
no file, or its own; whatever changes in the folder (but the other workers' own ``workertemp_*``) while the chief
waits was written by another worker. Before them: a save the chief alone makes; then, as TensorFlow's
"Multi-worker training with Keras" tutorial writes them, a ``Model.save`` and a ``CheckpointManager.save`` that
name the chief's path on the chief and a path of its own on each other worker, which that worker deletes after
(its own files are written, as the script says). Then
``tf.distribute.MultiWorkerMirroredStrategy()`` again (and its deprecated alias), every other strategy that
TensorFlow builds beside it (each with a model trained and predicting in its scope, the session's all-reduce
after it), the ones it refuses, a fit of the first model, a save
of each worker's own file inside ``tfdist.saves_on_every_worker()``, a save that Keras refuses and one given no
path at all (``123``). Last, after the ``RESULTS`` line, every worker but the chief saves from a line the chief
never reaches: it ends with one ``error:`` line once the chief's script has ended.
"""

import json
import os
import sys
import time

import tfdist

strategy = tfdist.setup()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

out = sys.argv[1]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
chief = strategy.extended.should_checkpoint
TAG = 1000.0 + index


class Tag(keras.layers.Layer):
    """Adds 0 times a weight that tells which worker's file a reload read."""

    def build(self, shape):
        self.tag = self.add_weight(shape=(), initializer="zeros", trainable=False, name="tag")

    def call(self, x):
        return x + 0.0 * self.tag


def make_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), Tag(name="tag")])
    model.compile(optimizer="sgd", loss="mse")
    return model


with strategy.scope():
    model = make_model()
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = np.random.default_rng(1).normal(size=(64, 3)).astype("float32")
model.fit(x, y, batch_size=16, epochs=1, verbose=0)
model.get_layer("tag").tag.assign(TAG)  # this worker's copy alone: the file says who wrote it
expected = model(x).numpy()


#: What changed in the folder while the chief slept before a save: nothing, unless another worker wrote there.
foreign = []


def listing() -> dict:
    """The folder's files but the other workers' own (``workertemp_*``, theirs to write and delete)."""
    return {os.path.relpath(os.path.join(d, f), out): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, files in os.walk(out) for f in files if "workertemp_" not in d}


def slow(save):
    """The save, 3 s late on the chief; what changed in the folder meanwhile is noted in ``foreign``."""
    def late(*args, **kwargs):
        if chief:
            before = listing()
            time.sleep(3)
            after = listing()
            foreign.extend(sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)))
        return save(*args, **kwargs)
    return late


SLOWED = [(keras.Model, "save"), (keras.Model, "save_weights"), (keras.Model, "export"), (keras.saving, "save_model"),
          (tf.train.Checkpoint, "save"), (tf.train.Checkpoint, "write"), (tf.train.CheckpointManager, "save"),
          (tf.saved_model, "save")]
ORIGINALS = [getattr(owner, name) for owner, name in SLOWED]
for owner, name in SLOWED:
    setattr(owner, name, slow(getattr(owner, name)))


def same(predicted) -> bool:
    return bool(np.allclose(np.asarray(predicted), expected, atol=1e-6))


def saved_tags(directory) -> list:
    """The scalar float values a SavedModel holds (the tag among them)."""
    reader = tf.train.load_checkpoint(os.path.join(directory, "variables", "variables"))
    values = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map()]
    return sorted({float(v) for v in values if np.ndim(v) == 0 and np.asarray(v).dtype == np.float32 and v >= 1000})


results = {}

if chief:  # a save the chief alone makes: nobody waits for it, and it shifts nothing
    model.save(os.path.join(out, "chief_only.keras"))



def write_filepath(filepath):
    """TensorFlow's "Multi-worker training with Keras" tutorial's: the path on the chief, a path of each other
    worker's own (``workertemp_<index>`` beside it, made here), which the worker deletes after its save."""
    if chief:
        return filepath
    own = os.path.join(os.path.dirname(filepath), f"workertemp_{index}")
    tf.io.gfile.makedirs(own)
    return os.path.join(own, os.path.basename(filepath))


path = os.path.join(out, "keras2_style.keras")
write_model_path = write_filepath(path)
model.save(write_model_path)
if not chief:
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))  # the worker's own file was written: it is there to delete
loaded = keras.models.load_model(path, custom_objects={"Tag": Tag})
results["per-worker paths"] = {"tags": [float(loaded.get_layer("tag").tag.numpy())], "same": same(loaded(x))}

path = os.path.join(out, "model.keras")
model.save(path)
loaded = keras.models.load_model(path, custom_objects={"Tag": Tag})
results["Model.save"] = {"tags": [float(loaded.get_layer("tag").tag.numpy())], "same": same(loaded(x))}

path = os.path.join(out, "saved_with_keras.keras")
keras.saving.save_model(model, path)
loaded = keras.saving.load_model(path, custom_objects={"Tag": Tag})
results["keras.saving.save_model"] = {"tags": [float(loaded.get_layer("tag").tag.numpy())], "same": same(loaded(x))}

path = os.path.join(out, "only.weights.h5")
model.save_weights(path)
fresh = make_model()
fresh.load_weights(path)
results["Model.save_weights"] = {"tags": [float(fresh.get_layer("tag").tag.numpy())], "same": same(fresh(x))}

who = tf.Variable(TAG)
checkpoint = tf.train.Checkpoint(model=model, who=who)
directory = os.path.join(out, "checkpoints")
returned = [checkpoint.save(os.path.join(directory, "ckpt")) for _ in range(2)]
fresh, fresh_who = make_model(), tf.Variable(0.0)
tf.train.Checkpoint(model=fresh, who=fresh_who).restore(tf.train.latest_checkpoint(directory)).expect_partial()
results["Checkpoint.save"] = {"tags": [float(fresh_who.numpy()), float(fresh.get_layer("tag").tag.numpy())],
                              "same": same(fresh(x)), "returned": [os.path.relpath(p, out) for p in returned]}

path = os.path.join(out, "written", "weights")
returned = checkpoint.write(path)
fresh, fresh_who = make_model(), tf.Variable(0.0)
tf.train.Checkpoint(model=fresh, who=fresh_who).read(returned).expect_partial()
results["Checkpoint.write"] = {"tags": [float(fresh_who.numpy()), float(fresh.get_layer("tag").tag.numpy())],
                               "same": same(fresh(x)), "returned": [os.path.relpath(returned, out)]}

directory = os.path.join(out, "managed")
manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, who=who), directory, max_to_keep=2)
returned = [manager.save() for _ in range(3)]
fresh, fresh_who = make_model(), tf.Variable(0.0)
tf.train.Checkpoint(model=fresh, who=fresh_who).restore(manager.latest_checkpoint).expect_partial()
results["CheckpointManager.save"] = {
    "tags": [float(fresh_who.numpy()), float(fresh.get_layer("tag").tag.numpy())], "same": same(fresh(x)),
    "returned": [os.path.relpath(p, out) for p in returned],
    "latest": [os.path.relpath(manager.latest_checkpoint, out), os.path.relpath(tf.train.latest_checkpoint(directory), out)],
    "kept": [os.path.relpath(p, out) for p in manager.checkpoints]}

directory = os.path.join(out, "managed_by_each")
write_checkpoint_dir = write_filepath(directory)
checkpoint = tf.train.Checkpoint(model=model, who=who)
manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)
manager.save()
if not chief:
    tf.io.gfile.rmtree(write_checkpoint_dir)
fresh, fresh_who = make_model(), tf.Variable(0.0)
tf.train.Checkpoint(model=fresh, who=fresh_who).restore(tf.train.latest_checkpoint(directory)).expect_partial()
results["per-worker CheckpointManager"] = {
    "tags": [float(fresh_who.numpy()), float(fresh.get_layer("tag").tag.numpy())], "same": same(fresh(x))}
if not chief:
    tf.io.gfile.rmtree(os.path.dirname(write_checkpoint_dir))

path = os.path.join(out, "saved_model")
tf.saved_model.save(model, path)
reloaded = tf.saved_model.load(path)
served = reloaded.signatures["serving_default"](tf.constant(x))
results["tf.saved_model.save"] = {"tags": saved_tags(path), "same": same(list(served.values())[0])}

path = os.path.join(out, "exported")
model.export(path)
reloaded = tf.saved_model.load(path)  # kept: its functions read its variables
results["Model.export"] = {"tags": saved_tags(path), "same": same(reloaded.serve(x))}

def summed(made):
    """The sum over ``made``'s replicas of each replica's index + 1: its collectives at work."""
    def replica():
        return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32)

    return float(made.reduce("SUM", made.run(replica), axis=None))


results["again"] = tf.distribute.MultiWorkerMirroredStrategy() is strategy
results["alias again"] = tf.distribute.experimental.MultiWorkerMirroredStrategy() is strategy
results["summed"] = summed(strategy)
beside, refused = {}, {}
for name, make in [  # every strategy TensorFlow builds in one process beside MultiWorkerMirroredStrategy
        ("MirroredStrategy", lambda: tf.distribute.MirroredStrategy()),
        ("tf.compat.v1 MirroredStrategy", lambda: tf.compat.v1.distribute.MirroredStrategy()),
        ("CentralStorageStrategy", lambda: tf.distribute.experimental.CentralStorageStrategy()),
        ("OneDeviceStrategy", lambda: tf.distribute.OneDeviceStrategy("/cpu:0")),
        ("get_strategy", tf.distribute.get_strategy)]:
    made = make()
    with made.scope():  # a model of its own, trained and predicting there
        other = make_model()
    other.fit(x, y, batch_size=16, epochs=1, verbose=0)
    beside[name] = {"replicas": made.num_replicas_in_sync, "summed": summed(made),
                    "predicts": bool(np.isfinite(other.predict(x, verbose=0)).all()),
                    "session summed": summed(strategy)}  # the session's collectives still work after it
for name, make in [
        ("ParameterServerStrategy", lambda: tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver())),
        ("MultiWorkerMirroredStrategy(other)", lambda: tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1024)))]:
    try:
        make()
        refused[name] = None
    except (tfdist.errors.UserError, ValueError) as e:
        refused[name] = f"{type(e).__name__}: {e}"
results["beside"], results["refused"] = beside, refused
with strategy.scope():  # the session's strategy trains on after them all, the same loss on every worker
    again = make_model()
results["fit after"] = again.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False).history["loss"]
results["foreign"] = foreign

for (owner, name), original in zip(SLOWED, ORIGINALS):
    setattr(owner, name, original)
path = os.path.join(out, f"own-{index}.keras")
with tfdist.saves_on_every_worker():  # each worker's own file, written by itself
    model.save(path)
loaded = keras.models.load_model(path, custom_objects={"Tag": Tag})
results["saves_on_every_worker"] = {"tags": [float(loaded.get_layer("tag").tag.numpy())], "same": same(loaded(x))}
try:  # a save Keras refuses, on every worker: each says the script's path
    model.save(os.path.join(out, "no_extension"))
except ValueError as e:
    results["refused save"] = str(e)
try:  # no path at all: Keras' own error on every worker, as in one process
    model.save(123)
except (ValueError, TypeError) as e:
    results["no path"] = f"{type(e).__name__}: {e}"
print("RESULTS " + json.dumps(results), flush=True)
if not chief:  # a save the chief never makes: once the chief's script has ended, one line
    model.save(os.path.join(out, "worker_only.keras"))
