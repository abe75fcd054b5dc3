"""A user's setup for ``python -m tfdist.check --model``: a small classifier whose callback, the first time it
runs on a worker of a cluster, all-reduces a tensor of another shape on each worker. TensorFlow then aborts the
collectives of both processes, as a crash in a collective does; in fresh processes the callback does nothing.

``CHECK_CRASH_DIR`` names the folder of the marks that say on which workers the crash was planted already.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def setup():
    import keras
    import tensorflow as tf

    class CrashOnce(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            task = (json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}).get("index")
            mark = Path(os.environ["CHECK_CRASH_DIR"]) / f"planted-{task}"
            strategy = self.model.distribute_strategy
            if task is None or strategy.num_replicas_in_sync < 2 or mark.exists():
                return
            mark.touch()

            @tf.function
            def mismatched():
                context = lambda: tf.distribute.get_replica_context()  # noqa: E731
                return strategy.run(lambda: context().all_reduce("sum", tf.ones([1 + task])))

            mismatched()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")

    def model_fn():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model

    return model_fn, x, y, {"batch_size": 16, "epochs": 2, "shuffle": False, "callbacks": [CrashOnce()]}
