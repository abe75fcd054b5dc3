"""``tfdist.fit`` resuming a directory written otherwise: one ``UserError`` naming ``model_dir``, the directory unchanged.

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
