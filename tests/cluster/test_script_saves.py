"""A script's saves on two workers after ``tfdist.setup``, and one strategy per process.

``helpers/script_saves.py`` runs on 2 workers under ``tfdist.launch --local``: every save call a script makes
(Keras' ``Model.save``, ``keras.saving.save_model``, ``save_weights``, ``export``; TensorFlow's ``Checkpoint.save``
and ``write``, ``CheckpointManager.save``, ``tf.saved_model.save``), each followed at once by its load, with the
chief's saves 3 s late, after a save the chief alone makes and the multi-worker tutorial's saves to a path of each
worker's own (``write_filepath``: ``Model.save`` and ``CheckpointManager.save``), which that worker then deletes.
Every worker reads the chief's file (the tag each worker sets says whose), predicting what was saved; nothing
changes in the chief's paths while the chief waits to save (no other worker writes there); the folder holds the
chief's files alone; no worker's scratch folder is left; a save Keras refuses names the script's path on every
worker, and a save given no path at all (``123``) is Keras' own error there, as in one process. The same run builds
the strategy again (the session's comes back) and every other strategy TensorFlow builds beside it (each over the
worker's own devices, a model trained in its scope, the session's collectives at work after it); inside
``tfdist.saves_on_every_worker()`` each worker writes and reads a file of its own; last, a save from a line the
chief never reaches ends worker 1 with one ``error:`` line once the chief has ended.

The two TensorFlow tutorials on saving under a strategy, compact, with ``strategy = tfdist.setup()`` as their
strategy's line, run on 2 workers to their ends (the save-and-load tutorial loads and trains under a
``OneDeviceStrategy`` and predicts under a ``MirroredStrategy``). A second ``MultiWorkerMirroredStrategy`` of other
arguments, not caught, ends the script with one ``error:`` line and status 2.
"""

from __future__ import annotations

import sys

import pytest

from helpers.clis import HELPERS, assert_user_error
from helpers.cluster_runs import Processes, launcher, loopback_cluster
from helpers.outputs import tagged
from tfdist.quiet import is_noise

pytestmark = pytest.mark.slow

TASKS = ("worker:0", "worker:1")

#: What the folder holds after the saves: the chief's files, once each, and each worker's own file.
FOLDER = {"own-0.keras", "own-1.keras", "chief_only.keras", "keras2_style.keras", "model.keras",
          "saved_with_keras.keras", "only.weights.h5", "checkpoints", "written", "managed", "managed_by_each",
          "saved_model", "exported"}


def launched(tmp_path, script: str, *args: str, name: str = "launch") -> tuple[int, str]:
    cluster = loopback_cluster(tmp_path / f"{name}.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start(name, launcher(cluster, sys.executable, str(HELPERS / script), *args))
        return proc.wait(400), proc.text()


def per_task(text: str, task: str) -> str:
    prefix = f"[{task}] "
    return "\n".join(line[len(prefix):] for line in text.splitlines() if line.startswith(prefix))


def test_every_save_lands_once_and_every_worker_loads_the_chiefs_finished_file(tmp_path):
    out = tmp_path / "saves"
    out.mkdir()
    status, text = launched(tmp_path, "script_saves.py", str(out))
    assert status == 2 and "[launch] worker:0 exited with status 0" in text, text[-5000:]
    errors = [line for line in per_task(text, "worker:1").splitlines() if line.startswith("error: ")]
    assert "Traceback" not in per_task(text, "worker:1"), text[-5000:]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: Invalid save of {out / 'worker_only.keras'} at script_saves.py:"), errors
    assert "the chief made no save from that place" in errors[0] and "saves_on_every_worker" in errors[0], errors
    results = {task: tagged(per_task(text, task), "RESULTS") for task in TASKS}
    for task, result in results.items():
        for case in ("per-worker paths", "per-worker CheckpointManager", "Model.save", "keras.saving.save_model",
                     "Model.save_weights", "Checkpoint.save",
                     "Checkpoint.write", "CheckpointManager.save", "tf.saved_model.save", "Model.export"):
            assert result[case]["tags"] and set(result[case]["tags"]) == {1000.0}, (task, case, result[case])
            assert result[case]["same"], (task, case)
        own = result["saves_on_every_worker"]
        assert own == {"tags": [1000.0 + int(task[-1])], "same": True}, (task, own)
        assert result["Checkpoint.save"]["returned"] == ["checkpoints/ckpt-1", "checkpoints/ckpt-2"], task
        assert result["Checkpoint.write"]["returned"] == ["written/weights"], task
        managed = result["CheckpointManager.save"]
        assert managed["returned"] == ["managed/ckpt-1", "managed/ckpt-2", "managed/ckpt-3"], (task, managed)
        assert f"filepath={out / 'no_extension'}." in result["refused save"], (task, result["refused save"])
        assert result["no path"].startswith("ValueError: Invalid filepath extension") and \
            result["no path"].endswith("Received: filepath=123."), (task, result["no path"])
        assert managed["latest"] == ["managed/ckpt-3"] * 2 and managed["kept"] == ["managed/ckpt-2", "managed/ckpt-3"]
    assert results["worker:0"]["foreign"] == [], results["worker:0"]["foreign"]  # nothing but the chief wrote
    assert {p.name for p in out.iterdir()} == FOLDER
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert not [p for p in written if "temp" in p or "worker" in p], written
    assert sorted(p.name for p in (out / "managed").iterdir()) == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index", "ckpt-3.data-00000-of-00001", "ckpt-3.index"]
    assert not list(tmp_path.glob("tfdist-*-save-*")), list(tmp_path.glob("tfdist-*"))
    # One MultiWorkerMirroredStrategy per process: the session's again (its alias too); every other strategy
    # TensorFlow builds beside it is built over this worker's devices, trains and predicts in its scope, and the
    # session's collectives work after each (a re-initialised one fails or hangs).
    for task, result in results.items():
        assert result["again"] is True and result["alias again"] is True, task
        assert result["summed"] == 3.0, task  # 1 + 2 over the two workers' replicas
        assert set(result["beside"]) == {"MirroredStrategy", "tf.compat.v1 MirroredStrategy", "CentralStorageStrategy",
                                         "OneDeviceStrategy", "get_strategy"}, task
        for name, made in result["beside"].items():
            assert made == {"replicas": 1, "summed": 1.0, "predicts": True, "session summed": 3.0}, (task, name)
        refused = result["refused"]
        assert refused["ParameterServerStrategy"] == "ValueError: There must be at least one ps.", task  # TF's
        line = refused["MultiWorkerMirroredStrategy(other)"]
        assert line.startswith("UserError: Invalid second tf.distribute.MultiWorkerMirroredStrategy(...)"), line
        assert "\n" not in line, line
    assert results["worker:0"]["fit after"] == results["worker:1"]["fit after"]


@pytest.mark.parametrize("tutorial", ["tutorial_save_and_load.py", "tutorial_custom_training.py"])
def test_tensorflow_tutorials_on_saving_run_on_two_workers_with_one_line(tmp_path, tutorial):
    status, text = launched(tmp_path, tutorial, str(tmp_path / "work"))
    assert status == 0, text[-5000:]
    for task in TASKS:
        result = tagged(per_task(text, task), "RESULTS")
        assert result and all(result.values()), (task, result)
        if tutorial == "tutorial_save_and_load.py":  # to the tutorial's end, under the strategies it builds
            assert {"fit under OneDeviceStrategy", "tf.saved_model.load under MirroredStrategy"} <= set(result), result


#: One worker's cluster, set up across workers by ``tfdist.setup``, then a MirroredStrategy over its devices, and
#: a MultiWorkerMirroredStrategy of other arguments, not caught.
SECOND_STRATEGY = """
import sys
import tfdist
tfdist.setup(cluster=sys.argv[1], task="worker:0")
import tensorflow as tf
print("built", tf.distribute.MirroredStrategy().num_replicas_in_sync, flush=True)
tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1024))
print("not refused")
"""


def test_a_second_multi_worker_strategy_after_a_set_up_ends_the_script_with_one_line(python, tmp_path):
    cluster = loopback_cluster(tmp_path / "one.yaml", worker=1)
    script = tmp_path / "second.py"
    script.write_text(SECOND_STRATEGY)
    result = python([script, cluster], timeout=240)
    # A script's own stderr has TensorFlow's start-up lines before anything of tfdist's (no CLI quiets them).
    stderr = "".join(line for line in result.stderr.splitlines(keepends=True) if not is_noise(line.encode()))
    assert result.stdout == "built 1\n", result.stdout
    assert_user_error((result.returncode, "", stderr),
                      r"^error: Invalid second tf\.distribute\.MultiWorkerMirroredStrategy\(\.\.\.\) in this process: "
                      r"TensorFlow sets the collectives up once per process")
