"""``tfdist.fit``'s misuse: each bad argument is one ``UserError`` line naming it, before any set-up.

The process is never set up here: ``session.place`` and ``lifecycle.training_task`` (the
cluster, then TensorFlow and the strategy) are replaced by functions that
fail the test, so a check that came after them would show as that failure,
not as the expected line.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import tfdist
from helpers.models import dense
from tfdist.errors import UserError
from tfdist.runtime import lifecycle, session, who

X = np.zeros((8, 3), np.float32)
Y = np.zeros((8, 1), np.float32)


def model_fn():
    raise AssertionError("model_fn called: the arguments were not checked first")


def dataset():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)


CASES = {
    "model_fn a name": ({"model_fn": "unet"}, "Invalid `model_fn`. Received: a str ('unet'). Expected a function"),
    "validation_data an array": ({"validation_data": X},
                                 "Invalid `validation_data`. Received: a ndarray of shape (8, 3). Expected (x_val, "
                                 "y_val)"),
    "validation_data of 1": ({"validation_data": (X,)}, "Invalid `validation_data`. Received: a tuple of 1."),
    "validation_data rows": ({"validation_data": (X, Y[:5])},
                             "Invalid `validation_data`: its arrays' numbers of rows differ. Received: [5, 8]."),
    "validation_data weights": ({"validation_data": (X, Y, np.ones(3))},
                                "Invalid `validation_data`: its arrays' numbers of rows differ. Received: [3, 8]."),
    "steps_per_epoch -1": ({"steps_per_epoch": -1},
                           "Invalid value for `steps_per_epoch`. Received: steps_per_epoch=-1. Expected None or a "
                           "positive integer."),
    "steps_per_epoch 0": ({"steps_per_epoch": 0}, "Invalid value for `steps_per_epoch`. Received: steps_per_epoch=0."),
    "steps_per_epoch 2.5": ({"steps_per_epoch": 2.5},
                            "Invalid value for `steps_per_epoch`. Received: steps_per_epoch=2.5."),
    "steps_per_epoch True": ({"steps_per_epoch": True},
                             "Invalid value for `steps_per_epoch`. Received: steps_per_epoch=True."),
    "validation_steps 0": ({"validation_steps": 0},
                           "Invalid value for `validation_steps`. Received: validation_steps=0."),
    "validation_steps -2": ({"validation_steps": -2},
                            "Invalid value for `validation_steps`. Received: validation_steps=-2."),
    "validation_steps '3'": ({"validation_steps": "3"},
                             "Invalid value for `validation_steps`. Received: validation_steps='3'."),
    "epochs 0": ({"epochs": 0}, "Invalid value for `epochs`. Received: epochs=0. Expected a positive integer"),
    "x/y rows": ({"y": Y[:5]}, "Invalid `x`/`y`: their numbers of rows differ. Received: [5, 8]."),
    "sample_weight rows": ({"sample_weight": np.ones(5)},
                           "Invalid `x`/`y`/`sample_weight`: their numbers of rows differ. Received: [5, 8]."),
    "class_weight a list": ({"class_weight": [1.0, 2.0]}, "Invalid `class_weight`. Received: [1.0, 2.0]."),
    "class_weight with sample_weight": ({"class_weight": {0: 2.0}, "sample_weight": np.ones(8)},
                                        "Invalid `class_weight` with sample weights. Received: both."),
    "y with a Dataset": ({"x": "dataset", "batch_size": None},
                         "Invalid `y` with a dataset `x`. Received: y given."),
    "sample_weight with a Dataset": ({"x": "dataset", "y": None, "batch_size": None, "sample_weight": np.ones(8)},
                                     "Invalid `sample_weight` with a dataset `x`."),
    "no batch_size": ({"batch_size": None}, "Missing `batch_size`. Received: batch_size=None."),
    "model_fn a model": ({"model_fn": "a model"}, "Invalid `model_fn`. Received: a Sequential"),
    "initial_epoch True": ({"epochs": 2, "initial_epoch": True},
                           "Invalid value for `initial_epoch`. Received: initial_epoch=True with epochs=2."),
    "validation_data y None": ({"validation_data": (X, None)}, "Invalid `validation_data`. Received: x_val="),
    "class_weight NaN": ({"class_weight": {0: float("nan")}}, "Invalid `class_weight`. Received: {0: nan}."),
    "class_weight negative": ({"class_weight": {0: -1.0}}, "Invalid `class_weight`. Received: {0: -1.0}."),
    "class_weight negative class": ({"class_weight": {-1: 2.0}}, "Invalid `class_weight`. Received: {-1: 2.0}."),
    "strategy unknown": ({"strategy": "horovod"}, "Invalid value for `--strategy`. Received: strategy='horovod'."),
    "cpu_devices a string": ({"cpu_devices": "2"},
                             "Invalid value for `runtime.cpu_devices` in tfdist.fit. Received: cpu_devices='2'. "
                             "Expected an int."),
    "cpu_devices negative": ({"cpu_devices": -1}, "Invalid value for `--cpu_devices`. Received: cpu_devices=-1."),
    "connect_timeout a string": ({"connect_timeout": "60"},
                                 "Invalid value for `runtime.connect_timeout` in tfdist.fit. Received: "
                                 "connect_timeout='60'. Expected a float."),
    "connect_timeout 0": ({"connect_timeout": 0}, "Invalid value for `--connect_timeout`. Received: connect_timeout=0"),
    "progress_timeout NaN": ({"progress_timeout": float("nan")},
                             "Invalid value for `--progress_timeout`. Received: progress_timeout=nan."),
    "progress_timeout infinite": ({"progress_timeout": float("inf")},
                                  "Invalid value for `--progress_timeout`. Received: progress_timeout=inf. Expected a "
                                  "finite number."),
    "seed a string": ({"seed": "a"}, "Invalid value for `seed`. Received: seed='a'."),
    "seed 1.5": ({"seed": 1.5}, "Invalid value for `seed`. Received: seed=1.5."),
    "seed negative": ({"seed": -1}, "Invalid value for `--seed`. Received: seed=-1. Expected an integer in 0..2**32-1."),
    "verbose a word": ({"verbose": "loud"}, "Invalid value for `verbose`. Received: verbose='loud'."),
    "shuffle a word": ({"shuffle": "yes"}, "Invalid value for `shuffle`. Received: shuffle='yes'."),
    "callbacks an int": ({"callbacks": 5}, "Invalid `callbacks`. Received: 5 (int)."),
    "callbacks of ints": ({"callbacks": [5]}, "Invalid `callbacks`. Received: 5 (int)."),
    "model_dir a file": ({"model_dir": __file__}, "Invalid value for `model_dir`: not a directory. Received: "),
    "model_dir under a file": ({"model_dir": f"{__file__}/run"}, "Invalid value for `model_dir`: "),
    "model_dir an int": ({"model_dir": 5}, "Invalid value for `model_dir`. Received: model_dir=5."),
    "cluster an int": ({"cluster": 5, "task": "worker:0"},
                       "Invalid value for `runtime.cluster` in tfdist.fit. Received: cluster=5."),
    "task without cluster": ({"task": "worker:0", "strategy": "multi_worker_mirrored"},
                             "Missing `--cluster` for --task=worker:0."),
    "task 0": ({"task": 0}, "Invalid value for `runtime.task` in tfdist.fit. Received: task=0. Expected a str."),
    "task 0 with a cluster": ({"task": 0, "cluster": "c.yaml"},
                              "Invalid value for `runtime.task` in tfdist.fit. Received: task=0."),
    "cpu_devices absurd": ({"cpu_devices": 10**6},
                           "Invalid value for `--cpu_devices`. Received: cpu_devices=1000000. Expected an integer in "
                           "0..1024"),
    "validation_split 1.0": ({"validation_split": 1.0},
                             "Invalid value for `validation_split`. Received: validation_split=1.0. Expected a float "
                             "between 0 and 1 (0: no split)."),
    "validation_split -0.2": ({"validation_split": -0.2},
                              "Invalid value for `validation_split`. Received: validation_split=-0.2."),
    "validation_split a word": ({"validation_split": "0.2"},
                                "Invalid value for `validation_split`. Received: validation_split='0.2'."),
    "validation_split with a Dataset": ({"x": "dataset", "y": None, "batch_size": None, "validation_split": 0.2},
                                        "Invalid `validation_split` with a dataset `x`. Received: "
                                        "validation_split=0.2 and a "),
    "validation_split leaving no row": ({"validation_split": 0.9},
                                        "Invalid value for `validation_split`. Received: validation_split=0.9 of 8 "
                                        "rows, which leaves no row to train or to validate."),
    "validation_freq 0": ({"validation_freq": 0},
                          "Invalid value for `validation_freq`. Received: validation_freq=0. Expected a positive int"),
    "validation_freq a tuple": ({"validation_freq": (1, 2)},
                                "Invalid value for `validation_freq`. Received: validation_freq=(1, 2)."),
    "validation_freq an empty list": ({"validation_freq": []},
                                      "Invalid value for `validation_freq`. Received: validation_freq=[]."),
    "validation_freq a list of 0": ({"validation_freq": [0, 2]},
                                    "Invalid value for `validation_freq`. Received: validation_freq=[0, 2]."),
    "validation_freq 2.0": ({"validation_freq": 2.0},
                            "Invalid value for `validation_freq`. Received: validation_freq=2.0."),
    "model_dir unwritable": ({"model_dir": "/proc/1/run"},
                             "Invalid value for `model_dir`: /proc/1 is not writable. Received: '/proc/1/run'."),
    "initial_epoch epochs": ({"epochs": 2, "initial_epoch": 2},
                             "Invalid value for `initial_epoch`. Received: initial_epoch=2 with epochs=2. Expected an "
                             "integer with 0 <= initial_epoch < epochs."),
    "initial_epoch -1": ({"epochs": 2, "initial_epoch": -1}, "Invalid value for `initial_epoch`. Received: "
                                                              "initial_epoch=-1 with epochs=2."),
    "initial_epoch 1.0": ({"epochs": 2, "initial_epoch": 1.0}, "Invalid value for `initial_epoch`. Received: "
                                                                "initial_epoch=1.0 with epochs=2."),
    "epochs 2.0": ({"epochs": 2.0}, "Invalid value for `epochs`. Received: epochs=2.0."),
    "class_weight a string key": ({"class_weight": {"a": 1.0}}, "Invalid `class_weight`. Received: {'a': 1.0}."),
    "class_weight a fraction key": ({"class_weight": {0.5: 1.0}}, "Invalid `class_weight`. Received: {0.5: 1.0}."),
    "class_weight a class past 2**24": ({"class_weight": {10**12: 1.0}},
                                        "Invalid `class_weight`. Received: {1000000000000: 1.0}. Expected a dict "
                                        "{class index >= 0: finite weight >= 0}, e.g. {0: 1.0, 1: 5.0}, its classes "
                                        "below 16777216."),
    "y of objects": ({"y": np.array([None] * 8)}, "Invalid `y`: an array of Python objects. Received: an array of "
                                                  "dtype object, shape (8,)."),
    "x of objects": ({"x": np.array([[None] * 3] * 8)}, "Invalid `x`: an array of Python objects."),
    "validation_data of objects": ({"validation_data": (X, np.array([None] * 8))},
                                   "Invalid `validation_data`: an array of Python objects."),
    "PyDataset workers '2'": ({"x": "pydataset", "workers": "2"},
                              "Invalid `x`: its `workers` is not a number. Received: a Batches with workers='2'."),
    "PyDataset workers None": ({"x": "pydataset", "workers": None},
                               "Invalid `x`: its `workers` is not a number. Received: a Batches with workers=None."),
    "PyDataset workers 2.5": ({"x": "pydataset", "workers": 2.5},
                              "Invalid `x`: its `workers` is not a whole number. Received: a Batches with "
                              "workers=2.5."),
    "PyDataset max_queue_size '10'": ({"x": "pydataset", "workers": 2, "max_queue_size": "10"},
                                      "Invalid `x`: its `max_queue_size` is not a whole number. Received: a Batches "
                                      "with workers=2 and max_queue_size='10'."),
    "PyDataset max_queue_size None": ({"x": "pydataset", "workers": 1, "use_multiprocessing": True,
                                       "max_queue_size": None},
                                      "Invalid `x`: its `max_queue_size` is not a whole number."),
    "PyDataset of 0 batches": ({"x": "pydataset", "length": 0},
                               "Invalid `x`: a Batches of 0 batches. Received: len(x) == 0."),
    "PyDataset whose len raises": ({"x": "pydataset", "length": -1},
                                   "Invalid `x`: its length cannot be read. Received: a Batches whose __len__ raised "
                                   "ValueError"),
    "validation PyDataset workers '2'": ({"validation_data": "pydataset", "workers": "2"},
                                         "Invalid `validation_data`: its `workers` is not a number."),
    "TFDIST_STAGE_LIMIT 2GB": ({"TFDIST_STAGE_LIMIT": "2GB"},
                               "Invalid TFDIST_STAGE_LIMIT. Received: TFDIST_STAGE_LIMIT='2GB'. Expected a positive "
                               "number of bytes"),
    "TFDIST_STAGE_LIMIT -5": ({"TFDIST_STAGE_LIMIT": "-5"}, "Invalid TFDIST_STAGE_LIMIT. Received: "
                                                            "TFDIST_STAGE_LIMIT='-5'."),
    "TFDIST_STAGE_LIMIT nan": ({"TFDIST_STAGE_LIMIT": "nan"}, "Invalid TFDIST_STAGE_LIMIT."),
    "BackupAndRestore backup_dir a file": ({"callbacks": ["backup", "{d}/file"]},
                                           "Invalid value for `backup_dir` of the BackupAndRestore in `callbacks`: not "
                                           "a directory. Received: '{d}/file', an existing file."),
    "BackupAndRestore backup_dir under a file": ({"callbacks": ["backup", "{d}/file/backup"]},
                                                 "Invalid value for `backup_dir` of the BackupAndRestore in `callbacks`:"
                                                 " {d}/file is a file."),
    "BackupAndRestore backup_dir a FIFO": ({"callbacks": ["backup", "{d}/fifo"]},
                                           "Invalid value for `backup_dir` of the BackupAndRestore in `callbacks`: not "
                                           "a directory."),
    "BackupAndRestore backup_dir a symlink loop": ({"callbacks": ["backup", "{d}/loop/backup"]},
                                                   "Invalid value for `backup_dir` of the BackupAndRestore in "
                                                   "`callbacks`: Too many levels of symbolic links."),
    "BackupAndRestore backup_dir under /proc": ({"callbacks": ["backup", "/proc/tfdist-backup"]},
                                                "Invalid value for `backup_dir` of the BackupAndRestore in `callbacks`:"
                                                " /proc is not writable."),
    "BackupAndRestore backup_dir an int": ({"callbacks": ["backup", 5]},
                                           "Invalid `backup_dir` of the BackupAndRestore in `callbacks`. Received: "
                                           "backup_dir=5. Expected a path."),
    "TensorBoard log_dir a file": ({"callbacks": ["tensorboard", "{d}/file"]},
                                   "Invalid value for `log_dir` of the TensorBoard in `callbacks`: not a directory."),
    "ModelCheckpoint under a file": ({"callbacks": ["checkpoint", "{d}/file/m.keras"]},
                                     "Invalid value for `filepath` of the ModelCheckpoint in `callbacks`: not a "
                                     "directory."),
    "CSVLogger a directory": ({"callbacks": ["csv", "{d}"]},
                              "Invalid `filename` of the CSVLogger in `callbacks`: a directory. Received: '{d}'."),
}


def made(arguments: dict, where) -> dict:
    """``arguments`` with the inputs a case names made here: a Dataset, a PyDataset (its ``workers``,
    ``use_multiprocessing``, ``max_queue_size`` and ``length``), a callback of a path in ``where`` (``{d}``), or
    an environment variable."""
    import keras

    arguments = dict(arguments)
    pydataset = {k: arguments.pop(k) for k in ("workers", "use_multiprocessing", "max_queue_size", "length")
                 if k in arguments}
    for name in ("x", "validation_data"):
        if isinstance(arguments.get(name), str) and arguments[name] == "dataset":
            arguments[name] = dataset()
        if isinstance(arguments.get(name), str) and arguments[name] == "pydataset":
            arguments[name] = batches(**pydataset)
            if name == "x":
                arguments["y"], arguments["batch_size"] = None, None
    if "TFDIST_STAGE_LIMIT" in arguments:
        where["environ"].setenv("TFDIST_STAGE_LIMIT", arguments.pop("TFDIST_STAGE_LIMIT"))
    if isinstance(arguments.get("callbacks"), list) and isinstance(arguments["callbacks"][0], str):
        kind, path = arguments["callbacks"]
        path = path.format(d=where["d"]) if isinstance(path, str) else path
        maker = {"backup": keras.callbacks.BackupAndRestore, "tensorboard": keras.callbacks.TensorBoard,
                 "checkpoint": keras.callbacks.ModelCheckpoint, "csv": keras.callbacks.CSVLogger}[kind]
        callback = maker("placeholder.keras" if kind == "checkpoint" else "placeholder")
        setattr(callback, {"backup": "backup_dir", "tensorboard": "log_dir", "checkpoint": "filepath",
                           "csv": "filename"}[kind], path)
        arguments["callbacks"] = [callback]
    return arguments


def batches(workers=1, use_multiprocessing=False, max_queue_size=10, length=2):
    """A ``keras.utils.PyDataset`` of ``length`` batches of ``X``, ``Y`` (a negative ``length``: ``len`` raises)."""
    import keras

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return length

        def __getitem__(self, index):
            return X[:4], Y[:4]

    found = Batches()
    found.workers, found.use_multiprocessing, found.max_queue_size = workers, use_multiprocessing, max_queue_size
    return found


@pytest.fixture
def paths(tmp_path, monkeypatch):
    """A folder holding a file, a FIFO and a symbolic link loop, and the environment to set variables in."""
    import os

    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to("loop")
    return {"d": tmp_path, "environ": monkeypatch}


@pytest.fixture
def never_set_up(monkeypatch):
    """Fail the test if ``tfdist.fit`` reaches the cluster or the strategy's set-up."""
    def reached(*args, **kwargs):
        raise AssertionError("the process was set up before the arguments were checked")

    monkeypatch.setattr(session, "place", reached)
    monkeypatch.setattr(lifecycle, "training_task", reached)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_one_line_naming_it_before_any_set_up(case, never_set_up, paths):
    overrides, expected = CASES[case]
    arguments = made({"model_fn": model_fn, "x": X, "y": Y, "batch_size": 4, "epochs": 1, "strategy": "mirrored",
                      "verbose": 0, **overrides}, paths)
    expected = expected.replace("{d}", str(paths["d"]))
    before = sorted(p.name for p in paths["d"].iterdir())
    if arguments["model_fn"] == "a model":  # a built model where a function that builds one belongs
        arguments["model_fn"] = dense(3, compiled=False)
    with pytest.raises(UserError) as caught:
        tfdist.fit(arguments.pop("model_fn"), arguments.pop("x"), arguments.pop("y"), **arguments)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message
    assert sorted(p.name for p in paths["d"].iterdir()) == before  # nothing made where a callback would write


#: What Keras' fit on one device takes, and so must tfdist.fit: each reaches the set-up (arguments over X, Y).
ACCEPTED = {
    "shuffle None": {"shuffle": None},  # no shuffle, as Keras' adapters read a false value
    "shuffle a NumPy bool": {"shuffle": np.bool_(True)},
    "verbose None": {"verbose": None},  # silent, as Keras' fit reads a false value
    "class_weight NumPy keys and weights": {"class_weight": {np.int64(0): np.float32(1.0), np.int64(1): 2.0}},
    "class_weight whole-number float keys": {"class_weight": {0.0: 1.0, 1.0: 2.0}},
    "class_weight empty": {"class_weight": {}},
    "PyDataset workers 0": {"x": "pydataset", "workers": 0, "max_queue_size": "ignored without a pool"},
    "PyDataset workers -1 with multiprocessing": {"x": "pydataset", "workers": -1, "use_multiprocessing": True},
    "PyDataset max_queue_size 0": {"x": "pydataset", "workers": 2, "max_queue_size": 0},
    "PyDataset workers True": {"x": "pydataset", "workers": True},
    "callbacks' paths new": {"callbacks": ["backup", "{d}/new/backup"]},
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_what_keras_fit_takes_reaches_the_set_up(case, never_set_up, paths):
    arguments = made({"x": X, "y": Y, "batch_size": 4, "epochs": 1, "strategy": "mirrored", "verbose": 0,
                      **ACCEPTED[case]}, paths)
    with pytest.raises(AssertionError, match="the process was set up"):
        tfdist.fit(model_fn, arguments.pop("x"), arguments.pop("y"), **arguments)
    assert not (paths["d"] / "new").exists()


def test_good_arguments_reach_the_set_up(never_set_up):
    # The same call without a mistake goes on to the cluster: the checks above are not refusing everything.
    with pytest.raises(AssertionError, match="the process was set up"):
        tfdist.fit(model_fn, X, Y, batch_size=4, epochs=2, steps_per_epoch=2, validation_steps=1,
                   validation_data=(X, Y, np.ones(8)), sample_weight=np.ones(8), strategy="mirrored", verbose=0)


#: tfdist.setup's misuse: (arguments, the start of the one line). Each is refused before the process is set up.
SETUP_CASES = {
    "strategy unknown": ({"strategy": "horovod"}, "Invalid value for `--strategy`. Received: strategy='horovod'."),
    "cpu_devices a string": ({"cpu_devices": "2"},
                             "Invalid value for `runtime.cpu_devices` in tfdist.setup. Received: cpu_devices='2'."),
    "cpu_devices 1.5": ({"cpu_devices": 1.5},
                        "Invalid value for `runtime.cpu_devices` in tfdist.setup. Received: cpu_devices=1.5."),
    "connect_timeout a string": ({"connect_timeout": "x"},
                                 "Invalid value for `runtime.connect_timeout` in tfdist.setup."),
    "bytes_per_pack negative": ({"bytes_per_pack": -1}, "Invalid value for `--bytes_per_pack`. Received: "),
    "collective_timeout infinite": ({"collective_timeout": float("inf")},
                                    "Invalid value for `--collective_timeout`. Received: collective_timeout=inf."),
    "communication unknown": ({"communication": "mpi"}, "Invalid value for `--communication`."),
    "cluster an int": ({"cluster": 3, "task": "worker:0"}, "Invalid value for `runtime.cluster` in tfdist.setup."),
    "verbose a word": ({"verbose": "x"}, "Invalid value for `verbose` of tfdist.setup. Received: verbose='x'."),
    "task 0": ({"task": 0}, "Invalid value for `runtime.task` in tfdist.setup. Received: task=0. Expected a str."),
    "cpu_devices absurd": ({"cpu_devices": 10**6},
                           "Invalid value for `--cpu_devices`. Received: cpu_devices=1000000. Expected an integer in "
                           "0..1024"),
}


@pytest.mark.parametrize("case", sorted(SETUP_CASES))
def test_a_bad_argument_of_setup_is_one_line_naming_it_before_any_set_up(case, monkeypatch):
    def reached(*args, **kwargs):
        raise AssertionError("the process was set up before the arguments were checked")

    monkeypatch.setattr(session, "place", reached)
    monkeypatch.setattr(session, "start", reached)
    arguments, expected = SETUP_CASES[case]
    with pytest.raises(UserError) as caught:
        tfdist.setup(**arguments)
    assert str(caught.value).startswith(expected), str(caught.value)


#: After tfdist.setup: a run argument of fit that the set-up already fixed, given otherwise (the start of its line).
AFTER_SETUP_CASES = {
    "strategy": ({"strategy": "one_device"}, "Invalid `strategy` for tfdist.fit after tfdist.setup."),
    "cluster": ({"cluster": "other.yaml", "task": "worker:0"},
                "Invalid `cluster` for tfdist.fit after tfdist.setup. Received: cluster='other.yaml', and the process "
                "is set up with cluster='c.yaml'."),
    "task": ({"cluster": "c.yaml", "task": "worker:1"},
             "Invalid `task` for tfdist.fit after tfdist.setup. Received: task='worker:1', and the process is set up "
             "with task='worker:0'."),
}


@pytest.mark.parametrize("case", sorted(AFTER_SETUP_CASES))
def test_after_setup_fit_refuses_what_the_set_up_fixed_otherwise(case, never_set_up, monkeypatch):
    """After ``tfdist.setup("mirrored", cluster="c.yaml", task="worker:0")`` (a stand-in session), ``fit``'s own
    ``cluster=``/``task=`` are refused as ``strategy=`` is, not silently ignored; the set-up's own are accepted."""
    from tfdist import config as config_lib

    runtime = config_lib.runtime_config("tfdist.setup", strategy="mirrored", cluster="c.yaml", task="worker:0")
    monkeypatch.setattr(who, "current", lambda: session.Session(runtime=runtime, placement=None, strategy=None))
    arguments, expected = AFTER_SETUP_CASES[case]
    with pytest.raises(UserError) as caught:
        tfdist.fit(model_fn, X, Y, batch_size=4, epochs=1, verbose=0, **arguments)
    assert str(caught.value).startswith(expected), str(caught.value)


def test_after_setup_fit_accepts_the_set_ups_own_cluster_and_task(never_set_up, monkeypatch):
    from tfdist import config as config_lib

    runtime = config_lib.runtime_config("tfdist.setup", strategy="mirrored", cluster="c.yaml", task="worker:0")
    placement = types.SimpleNamespace(role="train", is_chief=True)
    monkeypatch.setattr(who, "current", lambda: session.Session(runtime=runtime, placement=placement, strategy=None))
    with pytest.raises(AssertionError, match="the process was set up"):
        tfdist.fit(model_fn, X, Y, batch_size=4, epochs=1, verbose=0, cluster="c.yaml", task="worker:0")


def test_after_setup_fit_takes_the_strategy_setup_returned(never_set_up, monkeypatch):
    """``tfdist.fit(..., strategy=tfdist.setup(...))``: the returned Strategy stands for the session's name."""
    from tfdist import config as config_lib

    import tensorflow as tf

    returned = tf.distribute.get_strategy()  # any Strategy object stands in for the one setup returned
    runtime = config_lib.runtime_config("tfdist.setup", strategy="mirrored")
    placement = types.SimpleNamespace(role="train", is_chief=True)
    monkeypatch.setattr(who, "current",
                        lambda: session.Session(runtime=runtime, placement=placement, strategy=returned))
    with pytest.raises(AssertionError, match="the process was set up"):
        tfdist.fit(model_fn, X, Y, batch_size=4, epochs=1, verbose=0, strategy=returned)


def test_fit_refuses_a_strategy_object_that_setup_did_not_return(never_set_up):
    import tensorflow as tf

    with pytest.raises(UserError, match=r"^Invalid `strategy` for tfdist.fit. Received: _DefaultDistributionStrategy "
                                        r".*which tfdist.setup did not return. Expected a strategy name \(one of "
                                        r"one_device, mirrored.*\) or the Strategy that tfdist.setup returned.$"):
        tfdist.fit(model_fn, X, Y, batch_size=4, epochs=1, verbose=0, strategy=tf.distribute.get_strategy())
