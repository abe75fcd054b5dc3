"""``tfdist.fit``'s bad inputs, found before or after TensorFlow starts: one ``UserError`` naming the argument,
with nothing written.

One fresh process (2 logical CPUs, and an in-process cluster of 2 workers and a ps for ``parameter_server``)
trains a small run to resume, then calls ``tfdist.fit`` once a case: a bad argument, a model or input that
does not fit, a damaged copy of the run directory, a resumption with another optimizer setting. Each must
raise ``UserError``; a new ``model_dir`` must not exist afterwards, and an existing one (an empty one too) must
hold the same paths, kinds and bytes as before. The same process pins two accepted inputs: a ``model_dir`` holding ``..``
trains where the kernel would resolve it (and makes no directory a ``..`` steps out of), and a model's own
``train_step`` on a last batch that splits 2/1 over the replicas trains as Keras' own ``fit`` on one device.
"""

from __future__ import annotations

import pytest

from helpers.models import source
from helpers.outputs import script_results

SCRIPT = source() + r'''
import json, logging, os, shutil, sys
from pathlib import Path

from tfdist.strategies import setup_host

setup_host(cpu_devices=2, inter_op_threads=4)
import keras, numpy as np, tensorflow as tf
import tfdist
from tfdist.deploy.in_process import in_process_cluster
from tfdist.errors import UserError

root = Path(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.random((64, 4), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
resolver = in_process_cluster(num_workers=2, num_ps=1)


def regression(optimizer=lambda: keras.optimizers.SGD(0.01), loss="mse", metrics=(), jit=False, layers=(),
               cls=keras.Sequential, width=4):
    def model_fn():
        keras.utils.set_random_seed(1)
        model = cls([keras.Input((width,)), *[make() for make in layers], keras.layers.Dense(1)])
        model.compile(optimizer=optimizer(), loss=loss, metrics=list(metrics), jit_compile=jit)
        return model
    return model_fn


def classifier():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    return model


class MeanState(keras.metrics.Metric):
    """A metric whose state aggregates with "mean": it does not add up over replicas."""

    def __init__(self, name="mean_state", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable((), "zeros", aggregation="mean", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(tf.reduce_mean(y_pred))

    def result(self):
        return self.total


def own_step(layers):
    """Keras' guide's model with its own train_step over the compiled loss and metrics, of ``layers``."""
    outputs = layers[0]
    for layer in layers[1:]:
        outputs = layer(outputs)
    return guide_model(layers[0], outputs)


def misnamed_logs(layers):
    """Keras' guide's model (``own_step``) whose train_step returns a log that is not one of its metrics."""
    guide = own_step(layers)

    class MisnamedLogs(type(guide)):
        def train_step(self, data):
            return {"batch_loss": super().train_step(data)["loss"]}

    return MisnamedLogs(guide.inputs, guide.outputs)


def uncompiled():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def snapshot(path):
    """Every path under ``path`` with its kind and bytes (None: nothing there)."""
    path = Path(path)
    if not path.exists():
        return None
    tree = {}
    for item in sorted(path.rglob("*")):
        tree[str(item.relative_to(path))] = item.read_bytes().hex() if item.is_file() else "dir"
    return tree


def ema_sgd(momentum=0.99, accumulation=2):
    return lambda: keras.optimizers.SGD(0.01, use_ema=True, ema_momentum=momentum,
                                        gradient_accumulation_steps=accumulation)


base = dict(x=x, y=y, batch_size=16, epochs=2, strategy="mirrored", verbose=0)
run = root / "run"  # the run that damaged copies and resumptions start from
tfdist.fit(regression(ema_sgd()), **base, model_dir=str(run))


def damaged(change):
    def make(path):
        shutil.copytree(run, path)
        change(path)
    return make


def write(name, data):
    return lambda path: (path / name).write_bytes(data)


def into_dir(name):
    def change(path):
        target = path / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        target.mkdir()
    return change


def into_file(name):
    def change(path):
        shutil.rmtree(path / name)
        (path / name).write_text("not a directory\n")
    return change


def drop_latest(path):
    for item in (path / "checkpoints").glob("ckpt-8.*"):
        item.unlink()


def cut_latest(path):
    for item in (path / "checkpoints").glob("ckpt-8.data-*"):
        item.write_bytes(item.read_bytes()[:10])


class Batches(keras.utils.PyDataset):
    """Two batches of ``make(index)``."""

    def __init__(self, make, **kwargs):
        super().__init__(**kwargs)
        self.make = make

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return self.make(index)


def batches_of(make, count=2):
    """A Python generator of ``count`` batches ``make(index)``."""
    return (make(index) for index in range(count))


four_parts = lambda index: (x[:16], y[:16], np.ones(16), np.ones(16))  # noqa: E731


# name -> (tfdist.fit's arguments over `base`, how its model_dir is made or None: a new one). A case on a copy of
# the run asks for an epoch more, which it would train.
fresh = regression()
ps = dict(strategy="parameter_server", cluster_resolver=resolver)
dataset = tf.data.Dataset.from_tensor_slices((x, y))
examples = tf.data.Dataset.from_tensor_slices((x, y[:, 0]))  # never batched: each label a scalar
CASES = {
    "loss reduction": (dict(model_fn=regression(loss=keras.losses.MeanSquaredError(reduction="sum"))), None),
    "metric state": (dict(model_fn=regression(metrics=[MeanState()])), None),
    "accumulation under ps": (dict(model_fn=regression(ema_sgd(accumulation=2)), **ps), None),
    "own train_step under ps": (dict(model_fn=regression(cls=own_step), **ps), None),
    "own train_step's logs not its metrics": (dict(model_fn=regression(cls=misnamed_logs)), lambda p: p.mkdir()),
    "uncompiled": (dict(model_fn=uncompiled), None),
    "a layer": (dict(model_fn=lambda: keras.layers.Dense(1)), None),
    "batch over replicas": (dict(model_fn=fresh, batch_size=15), None),
    "dataset_fn without steps": (dict(model_fn=fresh, x=lambda context: dataset.batch(8).repeat(), y=None), None),
    "repeating Dataset without steps": (dict(model_fn=fresh, x=dataset.batch(16).repeat(), y=None,
                                             batch_size=None), None),
    "x width": (dict(model_fn=fresh, x=np.zeros((64, 5), np.float32)), None),
    "validation_data width": (dict(model_fn=fresh, validation_data=(np.zeros((8, 5), np.float32), y[:8])), None),
    "y targets": (dict(model_fn=classifier, y=np.zeros((64, 2), np.float32)), None),
    "y targets that broadcast on two rows": (dict(model_fn=fresh, y=np.zeros((64, 2, 2), np.float32)), None),
    "validation_data targets": (dict(model_fn=classifier, y=np.eye(3, dtype=np.float32)[np.arange(64) % 3],
                                     validation_data=(x[:8], np.zeros((8, 2), np.float32))), None),
    "unbatched Dataset": (dict(model_fn=fresh, x=examples, y=None, batch_size=None), None),
    "unbatched validation Dataset": (dict(model_fn=fresh, validation_data=examples), None),
    "a Dataset of other examples": (dict(model_fn=fresh, x=dataset.map(lambda a, b: (a[:3], b)).batch(16), y=None,
                                         batch_size=None), None),
    "empty model_dir": (dict(model_fn=fresh, model_dir=""), "skip"),
    "model_dir under /proc": (dict(model_fn=fresh, model_dir="/proc/tfdist-bad-input/run"), "skip"),
    "model_dir under /sys": (dict(model_fn=fresh, model_dir="/sys/tfdist-bad-input"), "skip"),
    "2**63 steps": (dict(model_fn=fresh, epochs=2**32, steps_per_epoch=2**31), None),
    "2**64 steps of numpy": (dict(model_fn=fresh, epochs=2**62), None),
    "metrics.jsonl garbage": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(write("metrics.jsonl", b"{\x00garb\n"))),
    "metrics.jsonl a dir": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(into_dir("metrics.jsonl"))),
    "summary.json a dir": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(into_dir("summary.json"))),
    "fit.yaml a dir": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(into_dir("fit.yaml"))),
    "checkpoint NUL": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(write("checkpoints/checkpoint", b"\0" * 120))),
    "checkpoint empty": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(write("checkpoints/checkpoint", b""))),
    "checkpoint names a missing one": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(drop_latest)),
    "checkpoints a file": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(into_file("checkpoints"))),
    "tensorboard a file": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(into_file("tensorboard"))),
    "export a file": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(lambda p: (p / "export").write_text("x"))),
    "another ema_momentum": (dict(model_fn=regression(ema_sgd(momentum=0.9)), epochs=3), damaged(lambda p: None)),
    "another accumulation": (dict(model_fn=regression(ema_sgd(accumulation=4)), epochs=3), damaged(lambda p: None)),
    "x width on a whole run": (dict(model_fn=regression(ema_sgd()), x=np.zeros((64, 5), np.float32), epochs=3),
                               damaged(lambda p: None)),
    "tensorboard/train a file": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(into_file("tensorboard/train"))),
    "checkpoint data cut": (dict(model_fn=regression(ema_sgd()), epochs=3), damaged(cut_latest)),
    "model_fn of an argument": (dict(model_fn=lambda a: fresh()), None),
    "x of no rows": (dict(model_fn=fresh, x=x[:0], y=y[:0]), None),
    "validation_data of no rows": (dict(model_fn=fresh, validation_data=(x[:0], y[:0])), None),
    "x of strings": (dict(model_fn=fresh, x=np.full((64, 4), "a")), None),
    "sample_weight per feature": (dict(model_fn=fresh, sample_weight=np.ones((64, 3), np.float32)), None),
    "sample_weight a dict": (dict(model_fn=fresh, sample_weight={"a": np.ones(64)}), None),
    "sample_weight NaN": (dict(model_fn=fresh, sample_weight=np.full(64, np.nan)), None),
    "sample_weight strings": (dict(model_fn=fresh, sample_weight=np.full(64, "a")), None),
    "class_weight bool key": (dict(model_fn=classifier, y=np.eye(3, dtype=np.float32)[np.arange(64) % 3],
                                   class_weight={True: 1.0, 0: 1.0}), None),
    "empty validation Dataset": (dict(model_fn=fresh, validation_data=dataset.take(0).batch(8)), None),
    "repeating validation Dataset": (dict(model_fn=fresh, validation_data=dataset.batch(8).repeat()), None),
    "batch_size 2**63": (dict(model_fn=fresh, batch_size=2**63), None),
    "strategy ''": (dict(model_fn=fresh, strategy=""), None),
    "cluster_resolver a name": (dict(model_fn=fresh, cluster_resolver="in_process"), None),
    "model_dir a symlink loop": (dict(model_fn=fresh, model_dir=str(root / "loop" / "run")), "skip"),
    "model_dir blank": (dict(model_fn=fresh, model_dir="   "), "skip"),
    "a PyDataset of 4-part batches": (dict(model_fn=fresh, x=Batches(four_parts), y=None, batch_size=None), None),
    "a PyDataset whose batches raise": (dict(model_fn=fresh, x=Batches(lambda index: 1 / 0), y=None,
                                             batch_size=None), None),
    "a PyDataset of scalars": (dict(model_fn=fresh, x=Batches(lambda index: (1.0, 2.0)), y=None, batch_size=None),
                               None),
    "a generator of 4-part batches": (dict(model_fn=fresh, x=batches_of(four_parts), y=None, batch_size=None,
                                           epochs=1), None),
    "a generator of None": (dict(model_fn=fresh, x=batches_of(lambda index: None), y=None, batch_size=None,
                                 epochs=1), None),
    "a generator whose shapes change": (dict(model_fn=fresh, x=batches_of(lambda index: (x[:16, :4 - (index > 1)],
                                                                                       y[:16]), count=3),
                                             y=None, batch_size=None, epochs=1), None),
    "validation_data a PyDataset of 4-part batches": (dict(model_fn=fresh, validation_data=Batches(four_parts)), None),
}
(root / "loop").symlink_to("loop")
out = {}
for index, (name, (arguments, make)) in enumerate(CASES.items()):
    model_dir = root / f"case-{index}"
    if callable(make):
        make(model_dir)
    arguments = {**base, "model_dir": str(model_dir), **arguments}
    before = snapshot(arguments["model_dir"]) if arguments["model_dir"] else None
    try:
        tfdist.fit(**arguments)
        error = None
    except UserError as e:
        error = str(e)
    except Exception as e:
        error = f"RAW {type(e).__name__}: {e}"[:600]
    after = snapshot(arguments["model_dir"]) if arguments["model_dir"] else None
    out[name] = {"error": error, "untouched": before == after,
                 "cwd_untouched": not Path("fit.yaml").exists() and not Path("checkpoints").exists()}

# Accepted: NumPy integers, as Keras' fit takes them.
numpy_ints = tfdist.fit(fresh, x, y, batch_size=np.int64(16), epochs=np.int64(2), initial_epoch=np.int64(1),
                        steps_per_epoch=np.int32(2), seed=np.int64(3), strategy="mirrored", verbose=0)
out["numpy ints"] = {"epochs": len(numpy_ints.history["loss"])}

# Accepted: class_weight keys as NumPy ints or whole-number floats, as Keras' fit looks numpy labels up by them.
labels = (np.arange(64) % 3).astype("int64")
weights = {np.int64(0): 1.0, 1.0: np.float32(3.0)}


def seeded_classifier():
    keras.utils.set_random_seed(2)
    return classifier()


keras_classes = seeded_classifier()
keras_classes.fit(x, np.eye(3, dtype=np.float32)[labels], batch_size=16, epochs=2, shuffle=False, verbose=0,
                  class_weight=weights)
ours = tfdist.fit(seeded_classifier, x, np.eye(3, dtype=np.float32)[labels], batch_size=16, epochs=2, shuffle=False,
                  verbose=0, strategy="mirrored", class_weight=weights)
out["class_weight keys"] = {"weights": max(float(np.abs(a - b).max()) for a, b in
                                           zip(keras_classes.get_weights(), ours.model.get_weights()))}

# Accepted: one output's targets as a list of one array, as Keras' fit takes them.
keras_listed = seeded_classifier()
keras_listed.fit(x, [np.eye(3, dtype=np.float32)[labels]], batch_size=16, epochs=2, shuffle=False, verbose=0)
ours = tfdist.fit(seeded_classifier, x, [np.eye(3, dtype=np.float32)[labels]], batch_size=16, epochs=2,
                  shuffle=False, verbose=0, strategy="mirrored")
out["listed y"] = {"weights": max(float(np.abs(a - b).max()) for a, b in
                                  zip(keras_listed.get_weights(), ours.model.get_weights()))}

# Accepted: `..` resolved as the kernel would, with no directory made for what it steps out of.
tfdist.fit(fresh, **{**base, "epochs": 1}, model_dir=str(root / "dots" / "missing" / ".." / "run"))
out["dots"] = {"run": (root / "dots" / "run" / "fit.yaml").is_file(), "stray": (root / "dots" / "missing").exists()}

# A model's own train_step on rows whose last batch of 3 splits 2/1 over the replicas: one device's steps.
rows = x[:51], y[:51]
own = regression(cls=own_step, metrics=["mae"])
one = own()
one_history = one.fit(*rows, batch_size=16, epochs=2, shuffle=False, verbose=0).history
two = tfdist.fit(own, *rows, batch_size=16, epochs=2, shuffle=False, verbose=0, strategy="mirrored")
out["uneven"] = {"weights": max(float(np.abs(a - b).max()) for a, b in zip(one.get_weights(), two.model.get_weights())),
                 "one": one_history, "two": two.history}
# compile(jit_compile=True) where XLA cannot compile the step over 2 CPU replicas (batch norm synchronized inside
# the step, a model's own train_step, variables kept apart): each trains without XLA, as one device with XLA, and
# says so once.
said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("absl").addHandler(Said())
out["jit over cpu replicas"] = {}
for name, model_fn, strategy in (("synchronized", regression(jit=True, layers=[
        lambda: keras.layers.BatchNormalization(synchronized=True)]), "mirrored"),
                                 ("own train_step", regression(jit=True, cls=own_step), "mirrored"),
                                 ("central_storage", regression(jit=True), "central_storage")):
    one = model_fn()
    one.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    before = len(said)
    two = tfdist.fit(model_fn, x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, strategy=strategy)
    out["jit over cpu replicas"][name] = {
        "weights": max(float(np.abs(a - b).max()) for a, b in zip(one.get_weights(), two.model.get_weights())),
        "said": [line for line in said[before:] if "without XLA for" in line], "jit": two.model.jit_compile}
print("RESULTS " + json.dumps(out))
'''

#: Each case's expected line (a regular expression of the UserError's text).
EXPECTED = {
    "loss reduction": r"Invalid loss reduction for tfdist.fit: .* reduces with 'sum'",
    "metric state": r"Invalid metric for tfdist.fit: .*total aggregates with 'mean'",
    "accumulation under ps": r"Invalid optimizer for strategy='parameter_server': gradient_accumulation_steps=2",
    "own train_step under ps": r"Invalid model for tfdist.fit under strategy='parameter_server': GuideModel overrides",
    "uncompiled": r"Invalid model_fn: it must return a compiled keras.Model",
    "own train_step's logs not its metrics": r"Invalid train_step for tfdist.fit: it returns \['batch_loss'\], and "
                                             r"model.metrics are named \['loss'\]",
    "a layer": r"Invalid model_fn: it must return a compiled keras.Model. Received: a Dense",
    "batch over replicas": r"Invalid value for `batch_size`. Received: batch_size=15 with 2 replicas",
    "dataset_fn without steps": r"Missing `steps_per_epoch`. Received: an input of unknown length",
    "repeating Dataset without steps": r"Missing `steps_per_epoch`. Received: an input of unknown length",
    "x width": r"Invalid `x` for this model: the model cannot take its examples. Received: inputs of shapes "
               r"\[\(2, 5\)\]",
    "validation_data width": r"Invalid `validation_data` for this model: .* shapes \[\(2, 5\)\]",
    "y targets": r"Invalid `y` for this model's loss: .* targets of shapes \[\(2, 2\)\].* the loss says: "
                 r"Arguments `target` and `output` must have the same shape",
    "validation_data targets": r"Invalid `validation_data` for this model's loss: .* targets of shapes \[\(2, 2\)\]",
    "y targets that broadcast on two rows": r"Invalid `y` for this model's loss: .* targets of shapes \[\(2, 2, 2\)\].* "
                                            r"the loss says: Incompatible shapes: \[3,2,2\] vs. \[3,1\]\. Expected",
    "unbatched Dataset": r"Invalid `x`: a tf.data.Dataset of single examples .* dataset.batch\(64\)",
    "unbatched validation Dataset": r"Invalid `validation_data`: a tf.data.Dataset of single examples",
    "empty model_dir": r"Invalid value for `model_dir`. Received: model_dir=''",
    "model_dir under /proc": r"Invalid value for `model_dir`: /proc is not writable",
    "model_dir under /sys": r"Invalid value for `model_dir`: /sys is not writable",
    "2**63 steps": r"Invalid `epochs` with `steps_per_epoch`: more steps than a run counts. Received: "
                   r"epochs=4294967296 epochs of steps_per_epoch=2147483648 steps, 9223372036854775808 steps",
    "2**64 steps of numpy": r"Invalid `epochs` with `steps_per_epoch`: .*steps_per_epoch=4 steps",
    "metrics.jsonl garbage": r"line 1 of its metrics.jsonl is not a JSON object",
    "metrics.jsonl a dir": r"its metrics.jsonl is not a file. Received: a directory",
    "summary.json a dir": r"its summary.json is not a file. Received: a directory",
    "fit.yaml a dir": r"its fit.yaml is not a file. Received: a directory",
    "checkpoint NUL": r"its checkpoints/checkpoint is not a checkpoint state; ckpt-8's files are all there",
    "checkpoint empty": r"its checkpoints/checkpoint is empty; ckpt-8's files are all there",
    "checkpoint names a missing one": r"its checkpoints/checkpoint names ckpt-8, whose files are not there; "
                                      r"ckpt-4's files are all there: write 'model_checkpoint_path: \"ckpt-4\"'",
    "checkpoints a file": r"its checkpoints is not a directory. Received: a file",
    "tensorboard a file": r"its tensorboard is not a directory",
    "export a file": r"its export is not a directory",
    "another ema_momentum": r"it holds a tfdist.fit run with ema_momentum=0.99. Received: ema_momentum=0.9\b",
    "another accumulation": r"it holds a tfdist.fit run with gradient_accumulation_steps=2. Received: "
                            r"gradient_accumulation_steps=4",
    "x width on a whole run": r"Invalid `x` for this model: the model cannot take its examples. Received",
    "tensorboard/train a file": r"its tensorboard/train is not a directory. Received: a file",
    "checkpoint data cut": r"its latest checkpoint cannot be read, .*ckpt-8.index or its data is damaged \(IndexError: "
                           r"Read less bytes than requested\); an older checkpoint, .*ckpt-4, is whole",
    "model_fn of an argument": r"Invalid `model_fn`: it cannot be called without arguments .*Received: <lambda>\(a\)",
    "x of no rows": r"Invalid `x`: no rows. Received: arrays of 0 rows",
    "validation_data of no rows": r"Invalid `validation_data`: no rows",
    "x of strings": r"Invalid `x` for this model: the model cannot take its examples.*Cast string to float",
    "sample_weight per feature": r"Invalid `sample_weight` for its targets. Received: weights of shape \(64, 3\) for "
                                 r"targets of shape \(64, 1\)",
    "sample_weight a dict": r"Invalid `sample_weight`: a dict for a ndarray of targets",
    "sample_weight NaN": r"Invalid `sample_weight`: not finite. Received: 64 NaN or infinite weights",
    "sample_weight strings": r"Invalid `sample_weight`: not numbers. Received: an array of dtype <U1",
    "class_weight bool key": r"Invalid `class_weight`. Received: \{True: 1.0, 0: 1.0\}",
    "empty validation Dataset": r"Invalid `validation_data`: an empty tf.data.Dataset",
    "repeating validation Dataset": r"Missing `validation_steps`. Received: validation_data of unknown length",
    "batch_size 2**63": r"Invalid value for `batch_size`. Received: batch_size=9223372036854775808. Expected None or a "
                        r"positive integer below 2\*\*63",
    "strategy ''": r"Invalid value for `--strategy`. Received: strategy=''",
    "cluster_resolver a name": r"Invalid `cluster_resolver`. Received: 'in_process' \(str\)",
    "model_dir a symlink loop": r"Invalid value for `model_dir`: Too many levels of symbolic links",
    "model_dir blank": r"Invalid value for `model_dir`. Received: model_dir=' '",  # one line: spaces collapse
    "a PyDataset of 4-part batches": r"^Invalid `x`: Keras' data adapter cannot read its first batches. Received: "
                                     r"ValueError: PyDataset.__getitem__\(\) must return a tuple or a dict",
    "a PyDataset whose batches raise": r"^Invalid `x`: Keras' data adapter cannot read its first batches. Received: "
                                       r"ZeroDivisionError: division by zero",
    "a PyDataset of scalars": r"^Invalid `x`: .* the arrays must be at least rank 1",
    "a generator of 4-part batches": r"^Invalid `x`: a generator whose batches are of 4-tuples. Expected \(x, y\) or "
                                     r"\(x, y, sample_weight\) batches",
    "a generator of None": r"^Invalid `x`: .*the generator must return a tuple.*Received: None",
    "a generator whose shapes change": r"^Invalid `x`: .*Generator yielded an element of shape \(16, 3\) where an "
                                       r"element of shape \(None, 4\) was expected",
    "validation_data a PyDataset of 4-part batches": r"^Invalid `validation_data`: Keras' data adapter cannot read "
                                                     r"its first batches",
    "a Dataset of other examples": r"Invalid `x` for this model: the model cannot take its examples \(a Dataset "
                                   r"must yield batches: dataset.batch\(n\)\). Received: inputs of shapes "
                                   r"\[\(None, 3\)\]",
}


def results(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fit_bad_inputs")
    return script_results("fit_bad_inputs", ["-c", SCRIPT, str(root)], timeout=600)


@pytest.mark.xdist_group("fit_bad_inputs")
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_bad_input_is_one_user_error_and_writes_nothing(case, tmp_path_factory):
    import re

    found = results(tmp_path_factory)[case]
    assert found["error"] is not None and not found["error"].startswith("RAW"), found
    assert re.search(EXPECTED[case], found["error"]), (EXPECTED[case], found["error"])
    assert "\n" not in found["error"], found["error"]
    assert found["untouched"], f"{case}: model_dir written or changed"
    assert found["cwd_untouched"], f"{case}: trained into the working directory"


@pytest.mark.xdist_group("fit_bad_inputs")
def test_numpy_integers_are_taken_as_keras_fit_takes_them(tmp_path_factory):
    assert results(tmp_path_factory)["numpy ints"] == {"epochs": 1}


@pytest.mark.xdist_group("fit_bad_inputs")
def test_class_weight_keys_of_numpy_ints_and_whole_floats_train_as_keras_fit_on_one_device(tmp_path_factory):
    assert results(tmp_path_factory)["class_weight keys"]["weights"] < 1e-6


@pytest.mark.xdist_group("fit_bad_inputs")
def test_one_outputs_targets_as_a_list_of_one_train_as_keras_fit_on_one_device(tmp_path_factory):
    assert results(tmp_path_factory)["listed y"]["weights"] < 1e-6


@pytest.mark.xdist_group("fit_bad_inputs")
def test_a_model_dir_with_dot_dot_trains_where_the_kernel_resolves_it(tmp_path_factory):
    assert results(tmp_path_factory)["dots"] == {"run": True, "stray": False}


@pytest.mark.xdist_group("fit_bad_inputs")
def test_jit_compile_where_xla_cannot_compile_over_cpu_replicas_trains_without_it_as_one_device(tmp_path_factory):
    found = results(tmp_path_factory)["jit over cpu replicas"]
    assert sorted(found) == ["central_storage", "own train_step", "synchronized"], found
    for name, case in found.items():
        assert case["weights"] < 1e-5 and case["jit"] is True, (name, case)  # the model's setting is left as given
        assert len(case["said"]) == 1 and "compile(jit_compile=True): " in case["said"][0], (name, case)


@pytest.mark.xdist_group("fit_bad_inputs")
def test_an_own_train_step_on_a_batch_split_unevenly_trains_as_one_device(tmp_path_factory):
    found = results(tmp_path_factory)["uneven"]
    assert found["weights"] < 1e-6, found
    assert found["two"]["loss"] == pytest.approx(found["one"]["loss"], rel=1e-5), found
