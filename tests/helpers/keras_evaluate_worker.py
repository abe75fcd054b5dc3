"""Keras' own ``evaluate``, ``predict`` and ``fit`` on the model ``tfdist.fit`` returns, across workers.

Run once per task under ``tfdist.launch`` (``--out``): ``tfdist.fit`` of a
small classifier, with neither ``tfdist.setup`` nor ``tfdist.patch_keras``;
on the model it returns, Keras' ``evaluate`` (600 rows; 601 rows, whose last
batch does not split evenly over the workers, with ``return_dict=True``) and
``predict`` (601 rows); Keras' ``evaluate`` (601 rows) of a model of the same
weights whose compiled metrics were built outside the strategy's scope; then
Keras' own ``fit`` with ``validation_data`` of 601 rows. Writes ``evaluate-<task>.json`` (the figures) and
``weights-<task>-<when>.npz`` (the weights they were computed with).

``--reference DIR``: one process, one device: for each ``evaluate-*.json`` in
DIR, the same figures from the weights that worker saved, into
``reference-<task>.json``.
"""

import argparse
import glob
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--reference")
args = parser.parse_args()

import numpy as np  # noqa: E402
import keras  # noqa: E402

ROWS = 601


def data():
    """601 rows of two classes; the first 600 train."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 8)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] + 0.3 * rng.normal(size=ROWS) > 0).astype("int64")
    return x, y


def model_fn():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def figures(model, x, y) -> dict:
    """What the test compares: ``evaluate`` as a list (600 rows) and as a dict (601 rows), ``predict`` (601 rows)."""
    return {"evaluate_600": model.evaluate(x[:600], y[:600], verbose=0),
            "evaluate_601": model.evaluate(x, y, return_dict=True, verbose=0),
            "predict": model.predict(x, verbose=0).tolist()}


def save(model, name: str) -> None:
    np.savez(os.path.join(args.out, f"weights-{name}.npz"), *model.get_weights())


def reference(directory: str) -> None:
    x, y = data()
    model = model_fn()
    for path in sorted(glob.glob(os.path.join(directory, "evaluate-*.json"))):
        task = os.path.basename(path)[len("evaluate-"):-len(".json")]

        def load(when):
            with np.load(os.path.join(directory, f"weights-{task}-{when}.npz")) as saved:
                model.set_weights([saved[f"arr_{i}"] for i in range(len(saved.files))])

        load("fit")
        found = figures(model, x, y)
        load("keras_fit")
        validation = model.evaluate(x, y, return_dict=True, verbose=0)
        found["val"] = {"val_loss": validation["loss"], "val_accuracy": validation["accuracy"]}
        with open(os.path.join(directory, f"reference-{task}.json"), "w") as f:
            json.dump(found, f)


if args.reference:
    reference(args.reference)
else:
    import tfdist

    x, y = data()
    history = tfdist.fit(model_fn, x[:600], y[:600], batch_size=64, epochs=3, shuffle=False, verbose=0)
    model = history.model
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}{task['index']}"
    save(model, f"{name}-fit")
    found = figures(model, x, y)
    # The same weights in a model whose compiled metrics an eager compute_metrics built outside the strategy's
    # scope: Keras' evaluate across workers builds them again under it, so they sum every worker's examples.
    with model.distribute_strategy.scope():
        outside = model_fn()
    outside.set_weights(model.get_weights())
    outside.compute_metrics(x[:8], y[:8], outside(x[:8]))
    found["evaluate_601_metrics_built_outside"] = outside.evaluate(x, y, return_dict=True, verbose=0)
    keras_history = model.fit(x[:600], y[:600], batch_size=64, epochs=1, shuffle=False, validation_data=(x, y),
                              verbose=0)
    save(model, f"{name}-keras_fit")
    found["val"] = {key: keras_history.history[key][-1] for key in ("val_loss", "val_accuracy")}
    with open(os.path.join(args.out, f"evaluate-{name}.json"), "w") as f:
        json.dump(found, f)
