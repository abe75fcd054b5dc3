"""Keras' optimizer and compile features under ``parameter_server``, each compared with one device.

Run as a script: ``python feature_runs.py``. It starts an in-process cluster (a coordinator, 2 workers and a ps
task); for each feature (``_features``) it trains Keras' own ``model.fit`` without a strategy (the one-device
reference), then the same model with ``tfdist.fit`` under ``parameter_server``, and prints ``RESULTS {json}``: for
each feature, ``{"parameter_server": ...}`` with the largest relative difference of the per-epoch losses and of
the final weights (each tensor's relative L2), or the one-line refusal. The synchronous modes' runs of these
features are cases of the check's fixed sample (``tests/cluster/test_check.py``).
"""

from __future__ import annotations

import json
import sys

import numpy as np

#: Rows, global batch and epochs of every run: 6 steps an epoch.
ROWS, BATCH, EPOCHS = 384, 64, 2


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


def _targets(kind, y, y2):
    return {"label": y, "value": y2, "both": {"label": y, "value": y2}}[kind]


def _relative(a, b) -> float:
    """The largest relative L2 difference between two lists of weight arrays."""
    return float(np.max([np.linalg.norm(u - v) / max(np.linalg.norm(v), 1e-12) for u, v in zip(a, b, strict=True)]))


def _history_spread(a: list, b: list) -> float:
    return float(np.max([abs(u - v) / max(abs(v), 1e-12) for u, v in zip(a, b, strict=True)]))  # a NaN is kept


def main() -> None:
    import os

    import tfdist
    from tfdist.deploy.in_process import in_process_cluster
    from tfdist.errors import UserError
    from tfdist.strategies import setup_host

    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    setup_host(cpu_devices=1, inter_op_threads=4)
    tfdist.patch_keras()
    resolver = in_process_cluster(num_workers=2, num_ps=1)
    x, y, y2 = data()
    results = {}
    for name, (model_fn, kind) in _features().items():
        print(f"feature {name!r}", file=sys.stderr, flush=True)  # where a crash happened, in a test's output
        targets = _targets(kind, y, y2)
        reference = model_fn()
        ref_loss = reference.fit(x, targets, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0).history["loss"]
        ref_weights = reference.get_weights()  # read first: after a fit on the cluster they cannot be read here
        try:
            history = tfdist.fit(model_fn, x, targets, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                                 strategy="parameter_server", cluster_resolver=resolver)
            results[name] = {"parameter_server": {
                "loss": _history_spread(history.history["loss"], ref_loss),
                "weights": _relative(history.model.get_weights(), ref_weights)}}
        except UserError as error:
            results[name] = {"parameter_server": {"refused": str(error)}}
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
