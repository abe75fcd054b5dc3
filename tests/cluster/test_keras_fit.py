"""Keras' own ``model.fit`` across workers (``tfdist.keras_fit``): a user's script, real processes on 127.0.0.1.

The script is ``keras_fit_worker.py``, in the shape of TensorFlow's
"Multi-worker training with Keras" tutorial, run by ``tfdist.launch`` on two
workers and alone; it adds one tfdist line (``--form``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.clis import HELPERS, run_python
from helpers.models import source
from helpers.cluster_runs import (REPO, Processes, launcher, loopback_cluster, max_difference, npz_weights,
                                  started_pids)

SCRIPT = HELPERS / "keras_fit_worker.py"

pytestmark = pytest.mark.slow


def results(text: str) -> dict[str, dict]:
    """``task -> RESULT`` from a launcher's prefixed output (``local`` for a process alone), the last of each."""
    found = {}
    for line in text.splitlines():
        head, sep, rest = line.partition("RESULT ")
        if sep:
            found[head.strip().strip("[]") or "local"] = json.loads(rest)
    return found


def run_alone(procs: Processes, out: Path, *flags: str) -> dict:
    out.mkdir()
    proc = procs.start("alone", [sys.executable, str(SCRIPT), f"--out={out}", *flags])
    status = proc.wait(240)
    assert status == 0, proc.text()[-3000:]
    return results(proc.text())["local"]


def run_two_workers(procs: Processes, tmp_path: Path, out: Path, *flags: str, options=()) -> tuple[int, str]:
    out.mkdir()
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    proc = procs.start("launch", launcher(cluster, sys.executable, str(SCRIPT), f"--out={out}", *flags,
                                          options=("--grace_seconds=20", *options)))
    return proc.wait(400), proc.text()


def assert_same_result(got: dict, expected: dict, rel: float) -> None:
    assert sorted(got["history"]) == ["accuracy", "loss", "val_accuracy", "val_loss"], got
    for key, values in expected["history"].items():
        assert got["history"][key] == pytest.approx(values, rel=rel), key
    for key, value in expected["evaluate"].items():
        assert got["evaluate"][key] == pytest.approx(value, rel=rel), key
    assert got["predict"][0] == expected["predict"][0]  # every example's prediction, gathered from both workers
    assert got["predict"][1] == pytest.approx(expected["predict"][1], rel=rel)


def assert_same_batch_logs(got: dict, expected: dict) -> None:
    """Each train batch's logs (what a progress bar, TensorBoard's batch scalars and batch loggers get)
    equal one process's: the mean over every replica, not their sum."""
    assert len(got["batches"]) == len(expected["batches"]) > 1, got["batches"]
    for got_batch, expected_batch in zip(got["batches"], expected["batches"]):
        assert sorted(got_batch) == sorted(expected_batch) == ["accuracy", "loss"], got_batch
        # Two workers sum their halves of each batch in another order: within 2e-7 relative here.
        assert got_batch == pytest.approx(expected_batch, rel=1e-5), (got["batches"], expected["batches"])


def assert_same_x_alone(got: dict, expected: dict) -> None:
    """The autoencoder trained by ``fit(x)`` with no targets (``keras_fit.x_alone``) equals one process's, its loss
    per example or a scalar mean (``one_device.shares`` weighs the latter's gradients by each replica's share)."""
    assert sorted(got["history"]) == ["code", "loss"], got["history"]
    for key, values in expected["history"].items():
        assert got["history"][key] == pytest.approx(values, rel=1e-5), key
    for a, b in zip(got["weights"], expected["weights"]):
        assert np.max(np.abs(np.array(a) - np.array(b))) < 1e-6


def assert_same_generator_fits(got: list, expected: list) -> None:
    """Each fit of a Python generator of numpy views with an ``F1Score`` metric, or of a user's
    ``Dataset.from_generator`` of it (``keras_fit.owned_batches``), leaves the user's arrays as they were and trains
    every epoch as one process does, fit after fit."""
    assert len(got) == len(expected) == 3
    for fit, alone in zip(got, expected):
        assert fit["arrays_kept"] and alone["arrays_kept"]
        assert fit["loss"] == pytest.approx(alone["loss"], rel=1e-5)
        assert np.asarray(fit["f1_score"]) == pytest.approx(np.asarray(alone["f1_score"]), rel=1e-5)
        for a, b in zip(fit["weights"], alone["weights"]):
            assert np.max(np.abs(np.array(a) - np.array(b))) < 1e-6


def test_keras_fit_on_two_workers_equals_one_process_and_only_the_chief_writes_files(tmp_path):
    flags = ("--form=patch", "--x_alone", "--generator_fits=3")
    with Processes(tmp_path) as procs:
        alone = run_alone(procs, tmp_path / "alone", *flags)
        status, text = run_two_workers(procs, tmp_path, tmp_path / "two", *flags)
    assert status == 0, text[-4000:]
    found = results(text)
    assert alone["history"]["loss"][-1] < alone["history"]["loss"][0]  # it learns: there is something to compare
    # Two workers sum their halves of each global batch in another order: 2e-7 apart here, at most.
    for task in ("worker:0", "worker:1"):
        assert_same_result(found[task], alone, rel=1e-5)
        assert_same_batch_logs(found[task], alone)
        for loss in ("per_example", "mean"):
            assert_same_x_alone(found[task]["x_alone"][loss], alone["x_alone"][loss])
        assert_same_generator_fits(found[task]["generator_fits"], alone["generator_fits"])
    two = tmp_path / "two"
    chief_pid = started_pids(text)["worker:0"]
    for split in ("train", "validation"):
        events = list((two / "tb" / split).iterdir())
        assert len(events) == 1 and f".{chief_pid}." in events[0].name, events  # the chief's, alone
    assert sorted(p.name for p in (two / "ckpt").iterdir()) == ["model-1.keras", "model-2.keras", "model-3.keras"]
    assert len((two / "log.csv").read_text().splitlines()) == 4  # a header and 3 epochs, written once
    assert sorted(p.name for p in (two / "backup").iterdir()) == ["latest.weights.h5", "training_metadata.json"]
    # Worker 1 wrote into a directory of its own under its TMPDIR (the test's directory), removed at the end.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tfdist-worker")], list(tmp_path.iterdir())


def test_without_tfdist_keras_fit_fails_on_two_workers(tmp_path):
    # What the fix is for (keras#20585): the tutorial as it is fails on Keras 3.
    with Processes(tmp_path) as procs:
        status, text = run_two_workers(procs, tmp_path, tmp_path / "two", "--form=none")
    assert status != 0
    assert "PerReplica" in text, text[-3000:]


def _weight_sums(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_signal_to_one_worker_stops_both_at_one_step_saves_it_and_the_same_command_resumes(tmp_path):
    # Worker 1 sends itself SIGTERM after its 9th batch (epoch 2, batch 3); the vote rides on step 10's logs,
    # so both workers stop before step 11 and save step 10. The launcher restarts the same command once.
    with Processes(tmp_path) as procs:
        status, text = run_two_workers(procs, tmp_path, tmp_path / "run", "--form=setup", "--preempt_at=9",
                                       options=("--max_restarts=1",))
    assert status == 0, text[-4000:]
    assert "[worker:1] tfdist: preempted: worker:1 received SIGTERM; saved the step reached (10 steps" in text
    assert ("[worker:0] tfdist: preempted: another worker received SIGTERM or SIGUSR1 (this is worker:0); "
            f"saved the step reached (10 steps of this fit) to {tmp_path / 'run' / 'backup'}") in text
    assert "[launch] worker:1 exited with status 42" in text
    assert "[launch] worker:0 exited with status 42" in text  # its own 42, even with the launcher's SIGTERM
    assert "restarting every task (restart 1 of 1)" in text
    for task in ("worker0", "worker1"):
        rows = _weight_sums(tmp_path / "run" / f"weights-{task}.jsonl")
        begins = [i for i, row in enumerate(rows) if row["when"] == "begin"]
        assert len(begins) == 2, rows
        first_run = rows[begins[0] + 1:begins[1]]
        assert len(first_run) == 10, first_run  # 10 steps, then the stop
        # The resumed run starts from the weights of step 10, not of an epoch's end (step 6).
        assert rows[begins[1]]["sum"] == first_run[-1]["sum"]
        assert rows[begins[1]]["sum"] != first_run[5]["sum"]
    found = results(text)
    # Keras resumes at the start of the epoch it was in (its BackupAndRestore's epoch): epochs 2 and 3 remain.
    assert len(found["worker:0"]["history"]["loss"]) == 2
    assert found["worker:0"]["history"] == found["worker:1"]["history"]


#: A Keras script with tfdist's line for parameter_server: the same on every task (ps and workers serve
#: inside setup); the chief's model.fit is trained by tfdist.fit's coordinator loop, once (the serving tasks
#: end when the chief's script ends, with its status). What tfdist.fit cannot take is refused before it.
PS_SCRIPT = source() + """
import json, sys
import tfdist
strategy = tfdist.setup("parameter_server")
import numpy as np, keras, tensorflow as tf
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")
with strategy.scope():
    model = dense(8, 2, hidden=(16,), optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
refused = {}
for name, kwargs in {"validation_batch_size": dict(validation_split=0.1, validation_batch_size=16),
                     "dataset_split": dict(validation_split=0.1, dataset=True)}.items():
    data = (tf.data.Dataset.from_tensor_slices((x, y)).batch(32),) if kwargs.pop("dataset", False) else (x, y)
    try:
        model.fit(*data, epochs=1, **kwargs)
    except tfdist.errors.UserError as e:
        refused[name] = str(e)
# The last 64 rows validate, after epochs 2 and 4.
history = model.fit(x, y, batch_size=32, epochs=4, validation_split=0.125, validation_freq=2, verbose=0)
print("RESULT " + json.dumps({"history": history.history, "refused": refused}), flush=True)
"""


def test_keras_fit_under_parameter_server_is_trained_by_the_coordinator_with_validation_split_and_freq(tmp_path):
    script = tmp_path / "ps_script.py"
    script.write_text(PS_SCRIPT)
    cluster = loopback_cluster(tmp_path / "cluster.yaml", chief=1, worker=2, ps=1)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script)))
        status, text = proc.wait(400), proc.text()
    assert status == 0, text[-3000:]
    result = results(text)["chief:0"]
    history = result["history"]
    assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert len(history["loss"]) == 4 and history["loss"][-1] < 0.8 * history["loss"][0], history
    assert len(history["val_loss"]) == 2 and history["val_accuracy"][-1] > 0.8, history  # validation_freq=2
    # What tfdist.fit does not take: one line each, before anything runs.
    refused = result["refused"]
    assert refused["validation_batch_size"].startswith(
        "Invalid argument for model.fit under parameter_server: validation_batch_size. Received: "
        "validation_batch_size=16."), refused
    assert refused["dataset_split"].startswith("Invalid `validation_split` with a dataset `x`."), refused


def test_the_readme_example_trains_on_two_workers_and_the_chief_alone_writes(tmp_path):
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    example = REPO / "examples" / "keras_multi_worker.py"
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(example), f"--model_dir={tmp_path / 'run'}",
                                              "--epochs=2", "--steps_per_epoch=4"))
        status, text = proc.wait(300), proc.text()
    assert status == 0, text[-4000:]
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir()) == ["model-1.keras", "model-2.keras", "tensorboard"]
    assert len(list((run / "tensorboard" / "train").iterdir())) == 1
    assert "Epoch 2/2" in text


#: Runs of the keras.io guide's shape, each building the strategy 3 times: its failure came one run in three.
GUIDE_RUNS = 2


def test_steps_per_execution_a_strategy_built_three_times_and_a_slow_chief_end_on_two_workers(tmp_path):
    # compile(steps_per_execution=4) equals one process (history, batch logs, final weights); the keras.io
    # guide's run_training() builds MultiWorkerMirroredStrategy() again and fits, twice more, in each run;
    # the chief's on_train_end sleeps 5 s and then writes final.txt, which worker 1 sees when its fit returns.
    flags = ("--steps_per_execution=4", "--epochs=2")
    with Processes(tmp_path) as procs:
        alone = run_alone(procs, tmp_path / "alone", "--form=patch", *flags)
        runs = []
        for run in range(GUIDE_RUNS):
            root = tmp_path / f"run{run}"
            root.mkdir()
            runs.append((root, *run_two_workers(procs, root, root / "two", "--form=patch", *flags,
                                                "--constructions=3", "--slow_chief_end=5")))
    expected = npz_weights(tmp_path / "alone" / "final-local.npz")
    for root, status, text in runs:
        assert status == 0, text[-4000:]
        found = results(text)
        for task in ("worker:0", "worker:1"):
            assert_same_result(found[task], alone, rel=1e-5)
            assert_same_batch_logs(found[task], alone)
            assert len(found[task]["batches"]) == 4  # 2 epochs of 2 executions (Keras runs 4 steps each)
            assert found[task]["final_seen"], task  # fit returned after the chief's last write
            assert found[task]["same_strategy"] == [True, True], task  # the second and third are the first
            got = npz_weights(root / "two" / f"final-{task.replace(':', '')}.npz")
            assert max_difference(got, expected) < 1e-6


def test_jit_compile_on_cpu_across_workers_trains_without_xla_as_one_process_with_it_and_says_so(tmp_path):
    # XLA has no collectives for CPU devices: Keras' train and test steps run as plain tf.functions on each
    # worker, the same computation as one process's XLA-compiled steps.
    with Processes(tmp_path) as procs:
        alone = run_alone(procs, tmp_path / "alone", "--form=patch", "--jit_compile=true")
        status, text = run_two_workers(procs, tmp_path, tmp_path / "two", "--form=patch", "--jit_compile=true")
    assert status == 0, text[-4000:]
    found = results(text)
    expected = npz_weights(tmp_path / "alone" / "final-local.npz")
    for task in ("worker:0", "worker:1"):
        assert_same_result(found[task], alone, rel=1e-5)
        said = [line for line in text.splitlines() if line.startswith(f"[{task}]") and "without XLA for" in line]
        assert len(said) == 2 and "Keras' train step" in said[0] and "Keras' test step" in said[1], said
        assert max_difference(npz_weights(tmp_path / "two" / f"final-{task.replace(':', '')}.npz"), expected) < 1e-5


def test_keras_evaluate_predict_and_fit_on_the_model_tfdist_fit_returns_without_setup_equal_one_device(tmp_path):
    # The script calls tfdist.fit alone (no tfdist.setup, no patch_keras): tfdist.fit installs Keras' patch for
    # the model it returns. Keras' evaluate and fit's validation on its model must sum every worker's examples,
    # also where the last batch splits unevenly, and on a model whose compiled metrics were built outside the
    # strategy's scope; predict must gather every example.
    script = HELPERS / "keras_evaluate_worker.py"
    out = tmp_path / "out"
    out.mkdir()
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script), f"--out={out}",
                                              options=("--grace_seconds=20",)))
        assert proc.wait(400) == 0, proc.text()[-4000:]
    run_python([str(script), f"--reference={out}"], timeout=240, check=True)
    for task in ("worker0", "worker1"):
        got = json.loads((out / f"evaluate-{task}.json").read_text())
        one_device = json.loads((out / f"reference-{task}.json").read_text())
        assert len(got["evaluate_600"]) == 2, got
        assert sorted(got["evaluate_601"]) == ["accuracy", "loss"], got
        assert sorted(one_device) == ["evaluate_600", "evaluate_601", "predict", "val"], one_device
        assert sorted(got) == sorted([*one_device, "evaluate_601_metrics_built_outside"]), got
        for key, reference in (("evaluate_600", "evaluate_600"), ("evaluate_601", "evaluate_601"), ("val", "val"),
                               ("evaluate_601_metrics_built_outside", "evaluate_601")):
            # One device sums the batches in another order: within 1e-7 relative here.
            assert got[key] == pytest.approx(one_device[reference], rel=1e-6), (task, key, got[key],
                                                                               one_device[reference])
        assert np.shape(got["predict"]) == (601, 2)  # every example, gathered from both workers
        np.testing.assert_allclose(got["predict"], one_device["predict"], rtol=1e-6)
