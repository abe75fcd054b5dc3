"""``tfdist.fit`` on an evaluator task with nothing to follow or nothing to evaluate: one ``UserError`` naming the
argument, before the process is set up, with nothing written (one process, TF_CONFIG naming an evaluator task
of a cluster that is not there)."""

from __future__ import annotations

import json

from helpers.clis import run_python

SCRIPT = r'''
import json, sys
import keras
import numpy as np
import tfdist

run = sys.argv[1]
x = np.zeros((8, 4), "float32")
y = np.zeros((8,), "int64")


def model_fn():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def refused(**kwargs):
    try:
        tfdist.fit(model_fn, x, y, batch_size=4, connect_timeout=2, verbose=0, **kwargs)
    except tfdist.errors.UserError as e:
        return str(e)
    return "not refused"


class FourParts(keras.utils.PyDataset):
    """Batches of four parts, which Keras' data adapter refuses."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return x, y, np.ones(8), np.ones(8)


damaged = sys.argv[2]  # a run directory whose evaluator.jsonl is garbled
print(json.dumps({"no_model_dir": refused(validation_data=(x, y)),
                  "no_validation_data": refused(model_dir=run),
                  "validation_data Keras refuses": refused(model_dir=run, validation_data=FourParts()),
                  "model_dir a file": refused(model_dir=__file__, validation_data=(x, y)),
                  "evaluator.jsonl garbled": refused(model_dir=damaged, validation_data=(x, y))}))
'''

TF_CONFIG = {"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]},
             "task": {"type": "evaluator", "index": 0}}


def test_an_evaluator_without_model_dir_or_validation_data_is_one_line_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "evaluator.jsonl").write_bytes(b"{\x00garb\n")
    proc = run_python([str(_script(tmp_path)), str(run), str(damaged)], timeout=120,
                      env={"TF_CONFIG": json.dumps(TF_CONFIG), "TMPDIR": str(temporary)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["no_model_dir"] == (
        "Missing `model_dir` for the evaluator task evaluator:0 of tfdist.fit: it evaluates the checkpoints the "
        "chief saves there. Received: model_dir=None. Expected the chief's model_dir, on storage both tasks share.")
    assert result["no_validation_data"].startswith(
        "Missing `validation_data` for the evaluator task evaluator:0 of tfdist.fit: it has nothing to evaluate."), result
    assert result["validation_data Keras refuses"].startswith(
        "Invalid `validation_data`: Keras' data adapter cannot read its first batches. Received: ValueError: "
        "PyDataset.__getitem__() must return a tuple or a dict."), result
    assert result["model_dir a file"].startswith("Invalid value for `model_dir`: not a directory."), result
    assert "line 1 of its evaluator.jsonl is not a JSON object" in result["evaluator.jsonl garbled"], result
    assert all("\n" not in line for line in result.values())
    assert not run.exists() and list(temporary.iterdir()) == []  # nor a temporary run directory left behind
    assert sorted(p.name for p in damaged.iterdir()) == ["evaluator.jsonl"]
    assert (damaged / "evaluator.jsonl").read_bytes() == b"{\x00garb\n"


def _script(tmp_path):
    path = tmp_path / "evaluator_args.py"
    path.write_text(SCRIPT)
    return path
