"""A user's Keras script in the shape of TensorFlow's "Multi-worker training with Keras" tutorial.

Run once per task (``tfdist.launch`` gives each its TF_CONFIG), or alone. The
tfdist part is one line at the top (``--form``): ``setup`` replaces the
strategy line with ``tfdist.setup("multi_worker_mirrored")``; ``patch`` keeps
the tutorial's own ``tf.distribute.MultiWorkerMirroredStrategy()`` after
``tfdist.patch_keras()``; ``none`` is the tutorial as it is. Synthetic
MNIST-shaped data replaces the download. Prints ``RESULT {json}``: each
epoch's logs, ``evaluate``'s, and a checksum of ``predict``'s output.

``--preempt_at B``: worker 1 sends itself SIGTERM after global batch B, once
(a marker file in ``--out`` says it did), so a relaunch runs unsignalled.
"""

import argparse
import json
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("--form", choices=("setup", "patch", "none"), default="setup")
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--preempt_at", type=int, default=-1)
parser.add_argument("--steps_per_execution", type=int, default=1)
parser.add_argument("--jit_compile", choices=("auto", "true", "false"), default="auto")
parser.add_argument("--constructions", type=int, default=1)
parser.add_argument("--slow_chief_end", type=float, default=0.0)
parser.add_argument("--x_alone", action="store_true", help="then fit(x) an autoencoder (models.autoencoder)")
parser.add_argument("--generator_fits", type=int, default=0,
                    help="then this many fits of a Python generator of numpy views with an F1Score metric (every "
                         "second one through a Dataset.from_generator of it)")
args = parser.parse_args()

if args.form == "setup":
    import tfdist

    strategy = tfdist.setup("multi_worker_mirrored")
elif args.form == "patch":
    import tfdist

    tfdist.patch_keras()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

if args.form != "setup":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

per_worker_batch_size = 16
num_workers = len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("worker", [])) or 1
global_batch_size = 32  # the same global batch however many workers


def mnist_dataset(batch_size, seed=7):
    rng = np.random.default_rng(0)
    x = rng.random((384, 14, 14), dtype=np.float32)
    y = (x[:, :7].mean(axis=(1, 2)) * 10).astype(np.int64) % 10
    return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(384, seed=seed).repeat().batch(batch_size),
            tf.data.Dataset.from_tensor_slices((x[:96], y[:96])).batch(batch_size))


def make_strategy():
    """The strategy's line, as the script has it (``run_training`` of the keras.io guide runs it each time)."""
    return tfdist.setup("multi_worker_mirrored") if args.form == "setup" else tf.distribute.MultiWorkerMirroredStrategy()


def build_and_compile_cnn_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.layers.InputLayer(shape=(14, 14)),
        keras.layers.Reshape(target_shape=(14, 14, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.05), metrics=["accuracy"],
                  steps_per_execution=args.steps_per_execution,
                  jit_compile={"auto": "auto", "true": True, "false": False}[args.jit_compile])
    return model


class SelfPreempt(keras.callbacks.Callback):
    """Worker 1 sends itself SIGTERM after global batch ``at``, once."""

    def __init__(self, at):
        super().__init__()
        self.at, self.seen = at, 0
        self.marker = os.path.join(args.out, "preempted-once")

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
        if self.seen == self.at and task.get("index") == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGTERM)


class Weights(keras.callbacks.Callback):
    """Writes a checksum of the weights at the start of training and after each batch (``weights-<task>.jsonl``)."""

    def _write(self, when):
        task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
        path = os.path.join(args.out, f"weights-{task.get('type', 'local')}{task.get('index', '')}.jsonl")
        total = float(sum(np.abs(w).sum() for w in self.model.get_weights()))
        with open(path, "a") as f:
            f.write(json.dumps({"when": when, "sum": total}) + "\n")

    def on_train_begin(self, logs=None):
        self._write("begin")

    def on_train_batch_end(self, batch, logs=None):
        self._write(f"batch {batch}")


class BatchLogs(keras.callbacks.Callback):
    """Keeps the logs of every train batch, as a progress bar, TensorBoard or a CSV batch logger get them."""

    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append({k: float(v) for k, v in (logs or {}).items()})


class SlowChiefEnd(keras.callbacks.Callback):
    """On the chief only: ``on_train_end`` sleeps, then writes ``final.txt`` (a slow last checkpoint)."""

    def on_train_end(self, logs=None):
        if self.model.distribute_strategy.extended.should_checkpoint:
            time.sleep(args.slow_chief_end)
            with open(os.path.join(args.out, "final.txt"), "w") as f:
                f.write("written\n")


multi_worker_dataset, eval_dataset = mnist_dataset(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()

callbacks = [
    keras.callbacks.BackupAndRestore(backup_dir=os.path.join(args.out, "backup"), delete_checkpoint=False),
    keras.callbacks.ModelCheckpoint(os.path.join(args.out, "ckpt", "model-{epoch}.keras")),
    keras.callbacks.TensorBoard(log_dir=os.path.join(args.out, "tb")),
    keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv")),
    Weights(),
]
batch_logs = BatchLogs()
callbacks.append(batch_logs)
if args.preempt_at >= 0:
    callbacks.append(SelfPreempt(args.preempt_at))
if args.slow_chief_end:
    callbacks.append(SlowChiefEnd())
history = multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs, steps_per_epoch=6,
                                 validation_data=eval_dataset, callbacks=callbacks, verbose=0)
final_seen = os.path.exists(os.path.join(args.out, "final.txt"))  # before any other collective of this worker
evaluated = multi_worker_model.evaluate(eval_dataset, return_dict=True, verbose=0)
predicted = multi_worker_model.predict(eval_dataset, verbose=0)
# The keras.io guide's run_training(): the strategy's line again, a model in its scope, fit (twice more, say).
same_strategy = []
for _ in range(args.constructions - 1):
    again = make_strategy()
    same_strategy.append(again is strategy)
    with again.scope():
        model = build_and_compile_cnn_model()
    model.fit(multi_worker_dataset, epochs=1, steps_per_epoch=2, verbose=0)
x_alone = {}
if args.x_alone:  # fit(x) without targets: the autoencoder's own train_step (its loss per example or the batch's
    from models import autoencoder  # mean), a compiled loss it never calls

    rows = np.random.default_rng(0).normal(size=(96, 8)).astype(np.float32)
    for name, mean in (("per_example", False), ("mean", True)):
        with strategy.scope():
            model = autoencoder(mean=mean)
        trained = model.fit(rows, batch_size=global_batch_size, epochs=3, shuffle=False, verbose=0).history
        x_alone[name] = {"history": trained, "weights": [w.tolist() for w in model.get_weights()]}
generator_fits = []
if args.generator_fits:  # a generator yielding views of the same arrays each epoch: the step's replica slices of
    rng = np.random.default_rng(1)  # them must not write into them (F1Score multiplies into its labels)
    gx = rng.normal(size=(128, 6)).astype(np.float32)
    gy = np.eye(3, dtype=np.float32)[rng.integers(0, 3, size=128)]
    kept_x, kept_y = gx.copy(), gy.copy()

    def batches():
        while True:
            yield from ((gx[i:i + global_batch_size], gy[i:i + global_batch_size]) for i in range(0, 128, 32))

    for fit in range(args.generator_fits):  # the generator itself, then a user's Dataset.from_generator of it, ...
        data = batches() if fit % 2 == 0 else tf.data.Dataset.from_generator(batches, output_signature=(
            tf.TensorSpec((None, 6), tf.float32), tf.TensorSpec((None, 3), tf.float32)))
        keras.utils.set_random_seed(2)
        with strategy.scope():
            model = keras.Sequential([keras.layers.InputLayer(shape=(6,)), keras.layers.Dense(3, activation="softmax")])
            model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.SGD(learning_rate=0.5),
                          metrics=[keras.metrics.F1Score()])
        trained = model.fit(data, steps_per_epoch=4, epochs=3, verbose=0).history
        generator_fits.append({"loss": trained["loss"], "f1_score": [np.asarray(v).tolist() for v in trained["f1_score"]],
                               "weights": [w.tolist() for w in model.get_weights()],
                               "arrays_kept": bool(np.array_equal(gx, kept_x) and np.array_equal(gy, kept_y))})
        gx[...], gy[...] = kept_x, kept_y  # each fit starts from the same arrays
task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
np.savez(os.path.join(args.out, f"final-{task.get('type', 'local')}{task.get('index', '')}.npz"),
         *multi_worker_model.get_weights())
print("RESULT " + json.dumps({"history": history.history, "evaluate": evaluated,
                              "predict": [list(predicted.shape), float(np.abs(predicted).sum())],
                              "batches": batch_logs.logs, "final_seen": final_seen, "same_strategy": same_strategy,
                              "x_alone": x_alone, "generator_fits": generator_fits,
                              }), flush=True)
