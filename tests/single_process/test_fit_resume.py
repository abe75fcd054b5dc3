"""``tfdist.fit`` resuming: from a ``BackupAndRestore`` backup as Keras' ``fit`` resumes; a directory written
otherwise refused with one ``UserError`` naming ``model_dir``, the directory unchanged.

A ``BackupAndRestore`` run stopped by an exception and run again resumes at the epoch its backup holds (the
epoch's first batch with the weights saved within it, for an int ``save_freq``), as Keras' own ``fit`` on one
device does in the same process: the epochs run and the final weights agree, under ``one_device`` and
``mirrored`` (2 logical CPUs), with and without tfdist's own ``model_dir`` checkpoints beside the backup; where
tfdist's checkpoint holds a later step than the backup, the run resumes from it.

A 5-class model on a 3-class run, a truncated latest checkpoint, another ``batch_size`` on a finished run and
a ``tfdist.train`` directory are each refused in one line, never a raw TensorFlow error or an empty History. Every case runs in one process (a TensorFlow start costs seconds), on copies of one fitted run.
"""

from __future__ import annotations

from helpers.models import source

SCRIPT = source() + r"""
import hashlib, pathlib, shutil, sys
import numpy as np
import tfdist
from tfdist.errors import UserError

root = pathlib.Path(sys.argv[1])
x = np.random.default_rng(0).random((16, 3)).astype("float32")
y = np.arange(16) % 3


def model_fn(classes=3):
    def build():
        import keras
        return dense(3, classes, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return build


def contents(directory):
    return {str(p.relative_to(directory)): hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(directory.rglob("*"))}


def refused(case, directory, **kwargs):
    before = contents(directory)
    arguments = dict(batch_size=4, epochs=2, verbose=0, model_dir=str(directory), strategy="one_device")
    arguments.update(kwargs)
    try:
        tfdist.fit(arguments.pop("model_fn", model_fn()), x, y, **arguments)
    except UserError as e:
        print(f"{case}|{contents(directory) == before}|{e}", flush=True)
    else:
        print(f"{case}|accepted", flush=True)


run = root / "run"
tfdist.fit(model_fn(), x, y, batch_size=4, epochs=2, verbose=0, model_dir=str(run), strategy="one_device")
print("checkpoints|" + ",".join(sorted(p.name for p in (run / "checkpoints").glob("*.index"))), flush=True)
refused("batch_size", run, batch_size=8)
refused("classes", run, model_fn=model_fn(5))
train_dir = root / "train"
train_dir.mkdir()
(train_dir / "params.yaml").write_text("train: {global_batch_size: 4}\n")
refused("train_dir", train_dir)
for case, keep in (("truncated_older_whole", None), ("truncated_alone", 1)):
    damaged = root / case
    shutil.copytree(run, damaged)
    indexes = sorted((damaged / "checkpoints").glob("ckpt-*.index"), key=lambda p: int(p.stem.split("-")[1]))
    if keep:  # only the latest checkpoint is listed: no older one to fall back to
        for index in indexes[:-1]:
            for part in index.parent.glob(index.stem + ".*"):
                part.unlink()
    indexes[-1].write_bytes(indexes[-1].read_bytes()[:10])
    refused(case, damaged, epochs=3)
"""


def test_fit_refuses_a_directory_written_otherwise_in_one_line_and_changes_nothing(python, tmp_path):
    result = python(["-c", SCRIPT, str(tmp_path)], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = dict(line.split("|", 1) for line in result.stdout.splitlines() if "|" in line)
    assert len(rows["checkpoints"].split(",")) >= 2, rows["checkpoints"]  # an older checkpoint to fall back to
    run = tmp_path / "run"
    expected = {
        "batch_size": f"Invalid model_dir {run}: it holds a tfdist.fit run with batch_size=4. Received: batch_size=8.",
        "classes": f"Invalid model_dir {run}: its latest checkpoint {run}/checkpoints/ckpt-",
        "train_dir": f"Invalid model_dir {tmp_path / 'train'}: it holds a tfdist.train run, which tfdist.fit cannot "
                     "resume.",
        "truncated_older_whole": f"Invalid model_dir {tmp_path / 'truncated_older_whole'}: its latest checkpoint "
                                 "cannot be read,",
        "truncated_alone": f"Invalid model_dir {tmp_path / 'truncated_alone'}: its latest checkpoint cannot be read,",
    }
    for case, start in expected.items():
        unchanged, _, line = rows[case].partition("|")
        assert unchanged == "True", (case, rows[case])
        assert line.startswith(start) and "\n" not in line, (case, line)
    assert "holds another model, optimizer or precision than this run's" in rows["classes"]
    assert "an older checkpoint, " in rows["truncated_older_whole"] and ", is whole: remove " in rows[
        "truncated_older_whole"]
    assert "; no older checkpoint is whole." in rows["truncated_alone"]


BACKUP_SCRIPT = source() + r"""
import json, pathlib, sys
from tfdist.strategies import setup_host
setup_host(cpu_devices=2)
import numpy as np
import keras
import tfdist

root = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype(np.float32)
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(256, 1))).astype(np.float32)
ARGS = dict(batch_size=32, epochs=5, shuffle=False, verbose=0)  # 8 batches an epoch


def model_fn():
    return dense(8, hidden=(16,), activation="tanh", seed=1, optimizer=keras.optimizers.Adam(0.01))


class Interrupted(Exception):
    pass


class Stop(keras.callbacks.Callback):  # an interruption at the start of an epoch, or of a batch within it
    def __init__(self, epoch, batch=None):
        super().__init__()
        self.stop, self.batch, self.epoch = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if epoch == self.stop and self.batch is None:
            raise Interrupted(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == self.stop and batch == self.batch:
            raise Interrupted(batch)


class StopAtEnd(keras.callbacks.Callback):  # an interruption at the end of epoch 1, before a backup's save
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise Interrupted(epoch)


def resumed(train, directory, save_freq, stop):
    backup = keras.callbacks.BackupAndRestore(str(directory), save_freq=save_freq)
    try:
        train([stop, backup] if isinstance(stop, StopAtEnd) else [backup, stop])
    except Interrupted:
        pass
    else:
        raise AssertionError("not interrupted")
    return train([keras.callbacks.BackupAndRestore(str(directory), save_freq=save_freq)])


def keras_fit(callbacks):
    model = model_fn()
    return model.fit(x, y, callbacks=callbacks, **ARGS).history, model


def tfdist_fit(strategy, model_dir=None):
    def train(callbacks):
        history = tfdist.fit(model_fn, x, y, strategy=strategy, callbacks=callbacks, model_dir=model_dir, **ARGS)
        return history.history, history.model
    return train


def record(history, model):
    return {"loss": history["loss"], "weights": [w.tolist() for w in model.get_weights()]}


out = {"keras_whole": record(*keras_fit(None))}
for case, save_freq, stop in (("epoch", "epoch", (2,)), ("batch", 3, (2, 5))):
    out[f"keras_{case}"] = record(*resumed(keras_fit, root / f"keras-{case}", save_freq, Stop(*stop)))
    for strategy in ("one_device", "mirrored"):
        directory = root / f"{strategy}-{case}"
        out[f"{strategy}_{case}"] = record(*resumed(tfdist_fit(strategy), directory, save_freq, Stop(*stop)))
        out[f"{strategy}_{case}"]["left"] = directory.exists()
    out[f"model_dir_{case}"] = record(*resumed(tfdist_fit("one_device", str(root / f"run-{case}")),
                                               root / f"with-run-{case}", save_freq, Stop(*stop)))
# tfdist's checkpoint of epoch 2's start is saved before the callbacks' epoch end, the backup's of epoch 1 not: the
# later of the two resumes.
out["model_dir_older_backup"] = record(*resumed(tfdist_fit("one_device", str(root / "run-older")), root / "older",
                                                "epoch", StopAtEnd()))
print("RESULTS " + json.dumps(out), flush=True)
"""


def test_fit_resumes_from_a_backup_as_keras_fit_does(python, tmp_path):
    import json

    import numpy as np
    import pytest

    result = python(["-c", BACKUP_SCRIPT, str(tmp_path)], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    line = [row for row in result.stdout.splitlines() if row.startswith("RESULTS ")][-1]
    out = json.loads(line[len("RESULTS "):])
    # Keras' own: stopped at epoch 2, it runs epochs 2-4 again from the backup and ends where the whole run ends.
    whole, keras_epoch = out["keras_whole"], out["keras_epoch"]
    assert keras_epoch["loss"] == pytest.approx(whole["loss"][2:], rel=1e-6)
    for case in ("epoch", "batch"):
        reference = out[f"keras_{case}"]
        assert len(reference["loss"]) == 3, case  # epochs 2-4: a backup within epoch 2 resumes at its start
        for run in ("one_device", "mirrored", "model_dir"):
            got = out[f"{run}_{case}"]
            assert got["loss"] == pytest.approx(reference["loss"], rel=1e-6), (run, case)
            for mine, theirs in zip(got["weights"], reference["weights"]):
                theirs = np.asarray(theirs)
                assert np.abs(np.asarray(mine) - theirs).max() <= 1e-6 * np.abs(theirs).max(), (run, case)
            assert not got.get("left"), (run, case)  # the backup removed at the end, as Keras removes it
    older = out["model_dir_older_backup"]
    assert older["loss"] == pytest.approx(whole["loss"][2:], rel=1e-6)
    for mine, theirs in zip(older["weights"], whole["weights"]):
        assert np.abs(np.asarray(mine) - np.asarray(theirs)).max() <= 1e-6 * np.abs(np.asarray(theirs)).max()
    # Resuming within an epoch retrains that epoch's first batches on the weights saved: another model.
    assert out["keras_batch"]["loss"] != pytest.approx(keras_epoch["loss"], rel=1e-4)
