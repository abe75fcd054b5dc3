"""``tfdist.fit``'s side-car evaluator: one cluster of real processes on 127.0.0.1 (a chief and a worker under
``multi_worker_mirrored``, and an evaluator, under ``tfdist.launch --local``) runs one script that calls the same
``tfdist.fit`` on every task.

- The evaluator evaluates every checkpoint of the chief (one an epoch), oldest first, once: each row of
  ``evaluator.jsonl`` holds ``val_loss`` and ``val_accuracy`` equal, to float32 rounding, to the chief's own
  ``val_*`` of that epoch (the same weights and validation rows, evaluated over two workers), and its last
  one to Keras' own ``evaluate`` of the weights it restored.
- It ends by itself, status 0, once the training ends, and returns a History of what it evaluated.
- It writes only its own files: ``evaluator.jsonl`` and ``tensorboard/evaluator`` in the run directory, no
  checkpoint directory of its own, nothing in the chief's rows.
"""

from __future__ import annotations

import json
import re
import sys

from helpers.cluster_runs import Processes, launcher, loopback_cluster
from helpers.outputs import rows

SCRIPT = r'''
import json, os, sys
import numpy as np
import tfdist

run = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x[:, 0] + x[:, 1] > 0).astype("int64")
vx = rng.normal(size=(40, 4)).astype("float32")
vy = (vx[:, 0] - vx[:, 2] > 0).astype("int64")  # another rule: the validation figures move from epoch to epoch


def model_fn():
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


history = tfdist.fit(model_fn, x, y, batch_size=16, epochs=3, validation_data=(vx, vy), model_dir=run, verbose=1,
                     strategy="multi_worker_mirrored")
out = {"history": history.history, "epoch": history.epoch}
if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "evaluator":
    out["keras"] = history.model.evaluate(vx, vy, batch_size=16, verbose=0, return_dict=True)
print("RESULT " + json.dumps(out), flush=True)
'''

#: Relative difference allowed between two evaluations of the same weights on the same 40 rows: the float32
#: sum of 40 per-example losses in another order (two workers' halves, batches of 8 instead of 16) differs by
#: at most about 40 roundings of 6e-8 relative; 1e-5 leaves room for a kernel that rounds a row otherwise.
RELATIVE = 1e-5


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b), 1e-3)


def test_the_side_car_evaluator_evaluates_every_checkpoint_as_one_process_would_and_ends_with_the_run(tmp_path):
    script = tmp_path / "fit_evaluator.py"
    script.write_text(SCRIPT)
    cluster = loopback_cluster(tmp_path / "cluster.yaml", chief=1, worker=1, evaluator=1)
    run = tmp_path / "run"
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script), str(run)))
        status = proc.wait(300)
    text = proc.text()
    assert status == 0, text[-4000:]
    for name in ("chief:0", "worker:0", "evaluator:0"):
        assert f"[launch] {name} exited with status 0" in text, text[-4000:]
    results = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^\[(\S+)\] RESULT (.*)$", text, re.M)}
    chief, evaluator = results["chief:0"]["history"], results["evaluator:0"]

    # One row per checkpoint of the chief (an epoch of 4 steps each), oldest first, with the chief's val_* figures.
    evaluated = rows(run / "evaluator.jsonl")
    assert [r["step"] for r in evaluated] == [4, 8, 12], evaluated
    assert {r["split"] for r in evaluated} == {"evaluator"} and {r["examples"] for r in evaluated} == {40}
    assert len({r["val_loss"] for r in evaluated}) == 3  # each row a model of its own
    for epoch, row in enumerate(evaluated):
        for name in ("val_loss", "val_accuracy"):
            assert close(row[name], chief[name][epoch]), (name, epoch, row, chief)
    # The History it returns holds the same rows; its model, the last checkpoint, evaluates alike in Keras.
    assert evaluator["epoch"] == [0, 1, 2]
    assert evaluator["history"] == {name: [r[name] for r in evaluated] for name in ("val_loss", "val_accuracy")}
    assert close(evaluator["keras"]["loss"], evaluated[-1]["val_loss"]), (evaluator, evaluated)
    assert close(evaluator["keras"]["accuracy"], evaluated[-1]["val_accuracy"]), (evaluator, evaluated)
    assert "[evaluator:0] evaluator step 12: val_loss " in text

    # Its files only: the chief's rows hold no evaluator split; no checkpoint directory of its own.
    assert {r["split"] for r in rows(run / "metrics.jsonl")} == {"train", "eval"}
    assert list((run / "tensorboard" / "evaluator").glob("events.*"))
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "evaluator.jsonl", "fit.yaml", "metrics.jsonl",
                                                     "tensorboard"]
    assert not list(tmp_path.glob("tfdist-worker-ckpt-*-evaluator-0")), list(tmp_path.iterdir())
