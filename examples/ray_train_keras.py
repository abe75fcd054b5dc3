# This example shows how to use Keras 3 with Ray Train's TensorflowTrainer.
# It is Ray's own example (ray/train/examples/tf/tensorflow_mnist_example.py,
# after https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras)
# with Keras 3 instead of tf_keras, synthetic MNIST-shaped data instead of the
# download, and tfdist's line: `strategy = tfdist.setup("multi_worker_mirrored")`
# in place of `strategy = tf.distribute.MultiWorkerMirroredStrategy()` (and
# `import tfdist`). Without it, Keras 3's own `model.fit` fails under
# MultiWorkerMirroredStrategy with 2 or more workers (keras-team/keras#20585,
# ray-project/ray#47464: "Attempt to convert a value (PerReplica:{...}) with an
# unsupported type"). Ray Train sets TF_CONFIG for each worker (type "worker",
# index = its world rank), which tfdist.setup reads.
#
#   pip install "ray[train]"
#   python examples/ray_train_keras.py                 # model.fit, 2 workers, a local Ray cluster
#   python examples/ray_train_keras.py --tfdist_fit    # tfdist.fit inside train_loop_per_worker
#
# Offline, add RAY_USAGE_STATS_ENABLED=0 (Ray's usage report); tests/cluster/test_ray.py
# also sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (every Ray process on 127.0.0.1).
# --losses_dir DIR: each worker also writes its History (per-epoch loss and
# accuracy) to DIR/rank<R>.json, R its Ray world rank (the tests read them).
import argparse
import json
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import ray
from ray.train import Checkpoint, Result, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer
from ray.train.tensorflow.keras import ReportCheckpointCallback

import tfdist


def mnist_dataset(batch_size: int) -> tf.data.Dataset:
    # MNIST's shapes and dtypes, made up (no download): each image is its digit's fixed random
    # pattern under noise, so that a small CNN learns it in a few steps.
    rng = np.random.default_rng(0)
    patterns = rng.uniform(size=(10, 28, 28)).astype(np.float32)
    y_train = rng.integers(0, 10, size=1024).astype(np.int64)
    x_train = 0.5 * patterns[y_train] + 0.5 * rng.uniform(size=(1024, 28, 28)).astype(np.float32)
    train_dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(1024, seed=0)
        .repeat()
        .batch(batch_size)
    )
    return train_dataset


def build_cnn_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input(shape=(28, 28)),
            keras.layers.Reshape(target_shape=(28, 28, 1)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    return model


def compile_model(model: keras.Model, learning_rate: float) -> keras.Model:
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.SGD(learning_rate=learning_rate),
        metrics=["accuracy"],
    )
    return model


def write_losses(config: dict, history: dict):
    if config.get("losses_dir"):
        rank = ray.train.get_context().get_world_rank()
        with open(os.path.join(config["losses_dir"], f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "pid": os.getpid(), "tf_config": json.loads(os.environ["TF_CONFIG"]),
                       "history": {k: [float(v) for v in vs] for k, vs in history.items()}}, f)


def train_func(config: dict):
    per_worker_batch_size = config.get("batch_size", 64)
    epochs = config.get("epochs", 3)
    steps_per_epoch = config.get("steps_per_epoch", 70)

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])

    # The one added line, in place of `strategy = tf.distribute.MultiWorkerMirroredStrategy()`: the same
    # strategy from Ray's TF_CONFIG, with the process set up for it and Keras 3's own fit made to work.
    strategy = tfdist.setup("multi_worker_mirrored")

    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_cnn_model()
        learning_rate = config.get("lr", 0.001)
        compile_model(multi_worker_model, learning_rate)

    history = multi_worker_model.fit(
        multi_worker_dataset,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=[ReportCheckpointCallback()],
        verbose=2,
    )
    results = history.history
    write_losses(config, results)
    return results


def train_func_tfdist_fit(config: dict):
    # The same training with tfdist.fit instead of Keras' model.fit (it builds the model in the strategy's
    # scope itself, from a function, and trains with tfdist's own loop).
    per_worker_batch_size = config.get("batch_size", 64)
    epochs = config.get("epochs", 3)
    steps_per_epoch = config.get("steps_per_epoch", 70)

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])

    tfdist.setup("multi_worker_mirrored")  # first, before the dataset: tfdist.fit then trains under it

    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size)

    def model_fn():
        return compile_model(build_cnn_model(), config.get("lr", 0.001))

    history = tfdist.fit(
        model_fn,
        multi_worker_dataset,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        verbose=2,
    )
    results = history.history
    # tfdist.fit runs Keras callbacks on the chief only, and Ray Train wants every worker to report: each
    # worker reports every epoch's figures (the same on every worker) once fit returns, the last one with
    # the trained model, as ReportCheckpointCallback does.
    for epoch in range(len(results["loss"])):
        metrics = {key: float(values[epoch]) for key, values in results.items()}
        if epoch < len(results["loss"]) - 1:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            history.model.save(os.path.join(checkpoint_dir, "model.keras"))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(checkpoint_dir))
    write_losses(config, results)
    return results


def train_tensorflow_mnist(
    num_workers: int = 2,
    use_gpu: bool = False,
    epochs: int = 4,
    storage_path: str = None,
    tfdist_fit: bool = False,
    steps_per_epoch: int = 70,
    losses_dir: str = None,
) -> Result:
    config = {"lr": 0.1, "batch_size": 64, "epochs": epochs, "steps_per_epoch": steps_per_epoch,
              "losses_dir": losses_dir}
    trainer = TensorflowTrainer(
        train_loop_per_worker=train_func_tfdist_fit if tfdist_fit else train_func,
        train_loop_config=config,
        # One CPU per worker (Ray's default), on a machine with few cores.
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=storage_path),
    )
    results = trainer.fit()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--address", required=False, type=str, help="the address to use for Ray"
    )
    parser.add_argument(
        "--num-workers",
        "-n",
        type=int,
        default=2,
        help="Sets number of workers for training.",
    )
    parser.add_argument(
        "--use-gpu", action="store_true", default=False, help="Enables GPU training"
    )
    parser.add_argument(
        "--epochs", type=int, default=3, help="Number of epochs to train for."
    )
    parser.add_argument(
        "--steps-per-epoch", type=int, default=70, help="Steps per epoch."
    )
    parser.add_argument(
        "--tfdist_fit", "--tfdist-fit", action="store_true", default=False,
        help="Train with tfdist.fit inside train_loop_per_worker instead of Keras' model.fit.",
    )
    parser.add_argument(
        "--storage-path", type=str, default=None, help="Ray Train's storage path (default ~/ray_results)."
    )
    parser.add_argument(
        "--losses_dir", "--losses-dir", type=str, default=None,
        help="Each worker writes its History to LOSSES_DIR/rank<R>.json.",
    )

    args, _ = parser.parse_known_args()

    if args.address:
        ray.init(address=args.address)
    else:
        # A local Ray cluster on this machine: CPUs for the workers and Ray Train's own actors, no dashboard.
        ray.init(num_cpus=max(4, args.num_workers + 2), num_gpus=args.num_workers if args.use_gpu else 0,
                 include_dashboard=False)
    try:
        result = train_tensorflow_mnist(
            num_workers=args.num_workers, use_gpu=args.use_gpu, epochs=args.epochs,
            storage_path=args.storage_path, tfdist_fit=args.tfdist_fit,
            steps_per_epoch=args.steps_per_epoch,
            losses_dir=os.path.abspath(args.losses_dir) if args.losses_dir else None,  # the workers' cwd is Ray's
        )
        print(f"Final metrics: {result.metrics}")
    finally:
        ray.shutdown()
