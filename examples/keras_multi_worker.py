"""TensorFlow's "Multi-worker training with Keras" tutorial, with tfdist's line: Keras' own fit across workers.

The tutorial's code, with synthetic MNIST-shaped data instead of the
download; the only tfdist line is the strategy's (marked below). Run it on
2 workers of this machine:

    python -m tfdist.launch --local --cluster configs/clusters/local_mwm.yaml -- \\
        python examples/keras_multi_worker.py --model_dir /tmp/keras-mwm

or alone (one process, the same global batch), or under Slurm, Kubernetes or
Ray Train, which set TF_CONFIG. Worker 0 (the chief) writes the checkpoints,
TensorBoard logs and backup; SIGTERM to any worker saves the step reached
through ``BackupAndRestore`` on every worker and ends them with status 42,
and the same command resumes.
"""

import argparse
import os

import tfdist

parser = argparse.ArgumentParser()
parser.add_argument("--model_dir", default="/tmp/keras-multi-worker")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=70)
flags = parser.parse_args()

# tfdist's line, first, instead of `strategy = tf.distribute.MultiWorkerMirroredStrategy()`.
strategy = tfdist.setup("multi_worker_mirrored")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402


def mnist_dataset(batch_size):
    """MNIST-shaped examples (28x28 in [0, 1], labels 0-9), generated: the tutorial downloads MNIST."""
    rng = np.random.default_rng(0)
    x_train = rng.random((2048, 28, 28), dtype=np.float32)
    y_train = (x_train[:, 10:18, 10:18].mean(axis=(1, 2)) * 20).astype(np.int64) % 10
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2048, seed=0).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = keras.Sequential([
        keras.layers.InputLayer(shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model


per_worker_batch_size = 64
num_workers = strategy.num_replicas_in_sync  # one CPU each
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()

callbacks = [
    keras.callbacks.BackupAndRestore(backup_dir=os.path.join(flags.model_dir, "backup")),
    keras.callbacks.ModelCheckpoint(os.path.join(flags.model_dir, "model-{epoch}.keras")),
    keras.callbacks.TensorBoard(log_dir=os.path.join(flags.model_dir, "tensorboard")),
]
multi_worker_model.fit(
    multi_worker_dataset, epochs=flags.epochs, steps_per_epoch=flags.steps_per_epoch, callbacks=callbacks
)
