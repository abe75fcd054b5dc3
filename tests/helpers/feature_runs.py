"""Keras' optimizer and compile features, trained in one process under several modes and compared with one device.

Run as a script: ``python feature_runs.py MODE [MODE ...]`` (each ``MODE`` a key of ``MODES``); a
multi-worker mode sets the process up first, so it runs under ``tfdist.launch`` on every worker. For each
feature of ``FEATURES`` it trains Keras' own ``model.fit`` without a strategy (the one-device reference),
then the same model in each mode, and prints ``RESULTS {json}``: for each feature and mode, the largest
relative difference of the per-epoch losses and of the final weights (each tensor's relative L2), or the
one-line refusal.
"""

from __future__ import annotations

import json
import sys

import numpy as np

#: Rows, global batch and epochs of every run: 6 steps an epoch.
ROWS, BATCH, EPOCHS = 384, 64, 2

#: What each mode trains with: ``tfdist.fit`` under a strategy's name, or Keras' own fit under a strategy.
MODES = {
    "one_device": ("tfdist", "one_device"),
    "mirrored": ("tfdist", "mirrored"),
    "central_storage": ("tfdist", "central_storage"),
    "multi_worker_mirrored": ("tfdist", "multi_worker_mirrored"),
    "parameter_server": ("tfdist", "parameter_server"),
    "keras_mirrored": ("keras", "mirrored"),
    "keras_multi_worker_mirrored": ("keras", "multi_worker_mirrored"),
}


def data():
    """``(x, y, y2)``: 8x8 images, a 3-class label and a regression target, fixed by seed."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 8, 8, 1)).astype(np.float32)
    y = ((x.mean(axis=(1, 2, 3)) > 0).astype(np.int64) + (x[:, 0, 0, 0] > 0.5)).astype(np.int64)
    return x, y, (3 * x.mean(axis=(1, 2, 3))[:, None]).astype(np.float32)


def _classifier(optimizer, **compile_args):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=optimizer(), loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  **compile_args)
    return model


def _two_outputs(optimizer):
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Flatten()(keras.layers.Conv2D(4, 3, activation="relu")(inputs))
    model = keras.Model(inputs, {"label": keras.layers.Dense(3, activation="softmax", name="label")(hidden),
                                 "value": keras.layers.Dense(1, name="value")(hidden)})
    model.compile(optimizer=optimizer(), loss={"label": "sparse_categorical_crossentropy", "value": "mse"},
                  loss_weights={"label": 1.0, "value": 0.3})
    return model


def _own_step(optimizer):
    """The keras.io guide's model with its own ``train_step``, feeding ``compute_loss`` to its loss metric."""
    import keras

    from tfdist.check.models import guide_model

    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 1))
    model = guide_model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(inputs)))
    model.compile(optimizer=optimizer(), loss="mse")
    return model


def _features():
    """``{name: (model_fn, target)}``: ``target`` is ``"label"``, ``"value"`` or ``"both"`` (the two outputs)."""
    import keras

    opt = keras.optimizers
    schedule = lambda: opt.schedules.ExponentialDecay(0.05, decay_steps=3, decay_rate=0.5)  # noqa: E731
    classifier = {
        "plain SGD": lambda: opt.SGD(0.1),
        "clipnorm": lambda: opt.SGD(0.1, clipnorm=0.05),
        "global_clipnorm": lambda: opt.Adam(0.01, global_clipnorm=0.05),
        "clipvalue": lambda: opt.SGD(0.1, clipvalue=0.01),
        "gradient_accumulation_steps=2": lambda: opt.Adam(0.01, gradient_accumulation_steps=2),
        "use_ema": lambda: opt.Adam(0.01, use_ema=True, ema_momentum=0.9),
        "use_ema, ema_overwrite_frequency=4": lambda: opt.Adam(0.01, use_ema=True, ema_momentum=0.9,
                                                              ema_overwrite_frequency=4),
        "AdamW weight_decay": lambda: opt.AdamW(0.01, weight_decay=0.1),
        "LossScaleOptimizer + clipnorm": lambda: opt.LossScaleOptimizer(opt.SGD(0.1, clipnorm=0.05)),
        "Lion": lambda: opt.Lion(0.001),
        "Adafactor": lambda: opt.Adafactor(0.05),
        "LearningRateSchedule": lambda: opt.SGD(schedule()),
    }
    features = {name: ((lambda make=make: _classifier(make)), "label") for name, make in classifier.items()}
    features["jit_compile=True"] = (lambda: _classifier(lambda: opt.Adam(0.01), jit_compile=True), "label")
    features["steps_per_execution=4"] = (lambda: _classifier(lambda: opt.Adam(0.01), steps_per_execution=4),
                                         "label")
    features["loss_weights (two outputs)"] = (lambda: _two_outputs(lambda: opt.Adam(0.01)), "both")
    features["own train_step (compute_loss)"] = (lambda: _own_step(lambda: opt.SGD(0.05)), "value")
    features["own train_step + clipnorm"] = (lambda: _own_step(lambda: opt.SGD(0.05, clipnorm=0.2)), "value")
    return features


#: The features trained across two workers (each run there costs a cluster's collectives).
ACROSS_WORKERS = ("plain SGD", "clipnorm", "global_clipnorm", "gradient_accumulation_steps=2", "use_ema",
                  "AdamW weight_decay", "LossScaleOptimizer + clipnorm", "jit_compile=True", "steps_per_execution=4",
                  "own train_step (compute_loss)", "own train_step + clipnorm")


def _targets(kind, y, y2):
    return {"label": y, "value": y2, "both": {"label": y, "value": y2}}[kind]


def _relative(a, b) -> float:
    """The largest relative L2 difference between two lists of weight arrays."""
    return float(np.max([np.linalg.norm(u - v) / max(np.linalg.norm(v), 1e-12) for u, v in zip(a, b, strict=True)]))


def _history_spread(a: list, b: list) -> float:
    return float(np.max([abs(u - v) / max(abs(v), 1e-12) for u, v in zip(a, b, strict=True)]))  # a NaN is kept


def _keras_fit(strategy, model_fn, x, targets):
    import tensorflow as tf

    with strategy.scope():
        model = model_fn()
    dataset = tf.data.Dataset.from_tensor_slices((x, targets)).batch(BATCH)
    history = model.fit(dataset, epochs=EPOCHS, verbose=0)
    return history.history["loss"], model.get_weights()


def main(modes: list[str]) -> None:
    import tfdist

    multi_worker = [m for m in modes if MODES[m][1] == "multi_worker_mirrored"]
    coordinated = [m for m in modes if MODES[m][1] == "parameter_server"]
    strategy, resolver = tfdist.setup("multi_worker_mirrored") if multi_worker else None, None
    if not multi_worker:
        import os

        from tfdist.strategies import setup_host

        os.environ["GRPC_FAIL_FAST"] = "use_caller"
        setup_host(cpu_devices=1 if coordinated else 2, inter_op_threads=4 if coordinated else 0)
        tfdist.patch_keras()
    if coordinated:  # one mode a process: a coordinator and its in-process cluster
        from tfdist.deploy.in_process import in_process_cluster

        resolver = in_process_cluster(num_workers=2, num_ps=1)
    import tensorflow as tf

    from tfdist.errors import UserError

    import functools

    # One MirroredStrategy for every Keras run, as a script makes it: Keras' own fit under a second one in a
    # process can reuse the first one's collective keys ("Shape mismatch in the collective instance"), tfdist or not.
    mirrored = functools.cache(lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    x, y, y2 = data()
    results = {}
    features = _features()
    for name, (model_fn, kind) in features.items():
        if multi_worker and name not in ACROSS_WORKERS:
            continue
        print(f"feature {name!r}", file=sys.stderr, flush=True)  # where a crash happened, in a test's output
        targets = _targets(kind, y, y2)
        reference = model_fn()
        ref_loss = reference.fit(x, targets, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0).history["loss"]
        ref_weights = reference.get_weights()
        row = results[name] = {}
        for mode in modes:
            how, strategy_name = MODES[mode]
            try:
                if how == "tfdist":
                    extra = {"cluster_resolver": resolver} if resolver is not None else {}
                    history = tfdist.fit(model_fn, x, targets, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                                         verbose=0, strategy=None if strategy is not None else strategy_name,
                                         **extra)
                    loss, weights = history.history["loss"], history.model.get_weights()
                else:
                    loss, weights = _keras_fit(strategy or mirrored(), model_fn, x, targets)
                row[mode] = {"loss": _history_spread(loss, ref_loss), "weights": _relative(weights, ref_weights)}
            except UserError as error:
                row[mode] = {"refused": str(error)}
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
