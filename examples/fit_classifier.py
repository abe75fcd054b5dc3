"""A small Keras classifier trained with ``tfdist.fit``, on one process or a cluster.

The model of the Keras guides (784 -> Dense 64 relu -> Dense 64 relu ->
Dense 10 softmax, RMSprop, sparse categorical cross-entropy) on random
inputs around 10 class centres, so that there is something to learn. The
same script on one process or on every task of a cluster:

    python examples/fit_classifier.py --strategy mirrored
    python -m tfdist.launch --local --cluster configs/clusters/local_mwm.yaml -- \\
        python examples/fit_classifier.py --strategy multi_worker_mirrored
    python -m tfdist.launch --local --cluster configs/clusters/local_ps.yaml -- \\
        python examples/fit_classifier.py --strategy parameter_server

Every training task prints ``HISTORY {json}``: the per-epoch figures of the
``History`` that ``tfdist.fit`` returns (the same on every task).
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def make_data(rows: int = 1000, seed: int = 0):
    """``(x, y)``: ``rows`` random labels of 10 classes, each row its class's fixed centre (0.2 x a normal
    784-vector) plus normal noise: learnable, but not at once (held-out accuracy 0.37, 0.67, 0.82 after
    epochs 1-3 with Keras' own fit)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(123).normal(size=(10, 784)).astype(np.float32)
    y = rng.integers(0, 10, rows)
    x = 0.2 * centres[y] + rng.normal(size=(rows, 784)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def model_fn():
    """The Keras guides' MLP, compiled; ``tfdist.fit`` calls it inside the strategy's scope."""
    import keras

    keras.utils.set_random_seed(1)  # the same initial weights in every process
    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.RMSprop(), loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--model_dir", default=None)
    parser.add_argument("--patience", type=int, default=2, help="EarlyStopping on val_loss: epochs without gain")
    parser.add_argument("--min_delta", type=float, default=0.0, help="EarlyStopping: the least gain that counts")
    args = parser.parse_args()

    import keras

    import tfdist

    x, y = make_data(1000, seed=0)
    x_val, y_val = make_data(200, seed=1)
    history = tfdist.fit(model_fn, x, y, batch_size=args.batch_size, epochs=args.epochs, strategy=args.strategy,
                         validation_data=(x_val, y_val), shuffle=False, model_dir=args.model_dir,
                         callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=args.patience,
                                                                  min_delta=args.min_delta)])
    print("HISTORY " + json.dumps(history.history), flush=True)


if __name__ == "__main__":
    main()
