"""``tfdist.fit`` takes Keras' ``sample_weight`` and ``class_weight``, and calls train-batch callback hooks.

In one fresh process (2 logical CPUs), the Keras guides' classifier
(``examples/fit_classifier.py``) trains with Keras' own ``model.fit`` and with
``tfdist.fit`` under the same strategy, from the same initial weights:

- numpy ``sample_weight`` (and weighted ``validation_data``), ``class_weight``
  (some classes listed, the others weigh 1.0, under ``one_device`` too), a Dataset of
  ``(x, y, sample_weight)`` batches and a Dataset with ``class_weight``, under
  ``mirrored``. Keras' default loss reduction gives ``sum(w * l) / n`` on each replica,
  which adds up over replicas, so every epoch's figures agree to float rounding
  (``sample_weight`` against one device in every mode and on 2 workers: the check's
  fixed sample, ``tests/cluster/test_check.py``);
- a callback that records its ``on_train_batch_begin``/``on_train_batch_end``
  calls sees Keras' calls: the batch indices of each execution
  (``steps_per_execution=2``: begin and end at Keras' indices, the last end
  past the epoch's last batch as Keras numbers it) and the epoch's logs so far.

A loss whose reduction does not add up over replicas (``"sum"``) is one ``UserError`` line
(``test_fit_bad_inputs.py``).
"""

from __future__ import annotations


import pytest

from helpers.clis import REPO
from helpers.outputs import script_results, spread

SCRIPT = r"""
import functools, json, sys
sys.path.insert(0, sys.argv[1])
from tfdist.strategies import setup_host
setup_host(cpu_devices=2)
import numpy as np, tensorflow as tf, keras
import tfdist
from fit_classifier import make_data, model_fn

x, y = make_data(384, seed=0)
xv, yv = make_data(96, seed=1)
rng = np.random.default_rng(5)
sw, swv = 2 * rng.random(384).astype(np.float32), 2 * rng.random(96).astype(np.float32)
some = {0: 0.5, 3: 2.0, 7: 3.0}
every = {c: 0.5 + c / 4 for c in range(10)}  # Keras' Dataset path needs every class listed
# One strategy of each kind for every Keras run, as a script makes it: a second MirroredStrategy in a process can
# reuse the first one's collective keys for collectives of other shapes ("Shape mismatch in the collective
# instance"), tfdist or not.
made = {"one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
        "mirrored": functools.cache(lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))}
runs = {
    "sample_weight": dict(x=x, y=y, sample_weight=sw, validation_data=(xv, yv, swv), batch_size=64, shuffle=False),
    "class_weight": dict(x=x, y=y, class_weight=some, batch_size=64, shuffle=False),
    "dataset_weights": dict(x=lambda: tf.data.Dataset.from_tensor_slices((x, y, sw)).batch(64)),
    "dataset_class_weight": dict(x=lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(64), class_weight=every),
}
out = {"plain": model_fn().fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0).history}
for name, kwargs in runs.items():
    for strategy in (("one_device", "mirrored") if name == "class_weight" else ("mirrored",)):
        made_x = (lambda: kwargs["x"]()) if callable(kwargs["x"]) else (lambda: kwargs["x"])
        args = {k: v for k, v in kwargs.items() if k != "x"}
        with made[strategy]().scope():
            model = model_fn()
        out[f"{name} keras {strategy}"] = model.fit(made_x(), epochs=2, verbose=0, **args).history
        out[f"{name} tfdist {strategy}"] = tfdist.fit(model_fn, made_x(), epochs=2, verbose=0, strategy=strategy,
                                                      **args).history


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(["begin", batch])

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(["end", batch, {k: float(v) for k, v in sorted(logs.items())}])


def two_per_execution():
    model = model_fn()
    model.compile(optimizer=keras.optimizers.RMSprop(), loss="sparse_categorical_crossentropy",
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")], steps_per_execution=2)
    return model


for name, build in (("hooks", model_fn), ("hooks_per_execution", two_per_execution)):
    keras_recorder, tfdist_recorder = Recorder(), Recorder()
    build().fit(x[:320], y[:320], batch_size=64, epochs=2, shuffle=False, verbose=0, callbacks=[keras_recorder])
    tfdist.fit(build, x[:320], y[:320], batch_size=64, epochs=2, shuffle=False, verbose=0, strategy="mirrored",
               callbacks=[tfdist_recorder])
    out[name] = {"keras": keras_recorder.calls, "tfdist": tfdist_recorder.calls}

print("RESULTS " + json.dumps(out))
"""

WEIGHTED = [("sample_weight", "mirrored"), ("class_weight", "one_device"), ("class_weight", "mirrored"),
            ("dataset_weights", "mirrored"), ("dataset_class_weight", "mirrored")]


def results() -> dict:
    return script_results("fit_weights_and_hooks", ["-c", SCRIPT, str(REPO / "examples")])


@pytest.mark.xdist_group("fit_weights")
@pytest.mark.parametrize("name,strategy", WEIGHTED)
def test_weights_train_as_keras_fit(name, strategy):
    out = results()
    got, expected = out[f"{name} tfdist {strategy}"], out[f"{name} keras {strategy}"]
    assert spread(got, expected) < 1e-5, (got, expected)
    # The weights change the figures: the weighted and the plain runs differ (a dropped weight would not).
    assert abs(got["loss"][0] - out["plain"]["loss"][0]) > 1e-3, (got, out["plain"])


@pytest.mark.xdist_group("fit_weights")
@pytest.mark.parametrize("name", ["hooks", "hooks_per_execution"])
def test_batch_hooks_see_keras_calls(name):
    calls = results()[name]
    keras_calls, tfdist_calls = calls["keras"], calls["tfdist"]
    executions = 5 if name == "hooks" else 3  # 5 batches an epoch, 2 per execution: 3 executions
    assert len(keras_calls) == 2 * 2 * executions, keras_calls
    assert [call[:2] for call in tfdist_calls] == [call[:2] for call in keras_calls]
    for got, expected in zip(tfdist_calls, keras_calls):
        if got[0] == "end":
            assert sorted(got[2]) == sorted(expected[2]) == ["accuracy", "loss"], (got, expected)
            for key in expected[2]:
                assert got[2][key] == pytest.approx(expected[2][key], rel=1e-5), (key, got, expected)

