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
}


@pytest.fixture
def never_set_up(monkeypatch):
    """Fail the test if ``tfdist.fit`` reaches the cluster or the strategy's set-up."""
    def reached(*args, **kwargs):
        raise AssertionError("the process was set up before the arguments were checked")

    monkeypatch.setattr(session, "place", reached)
    monkeypatch.setattr(lifecycle, "training_task", reached)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_one_line_naming_it_before_any_set_up(case, never_set_up):
    overrides, expected = CASES[case]
    arguments = {"model_fn": model_fn, "x": X, "y": Y, "batch_size": 4, "epochs": 1, "strategy": "mirrored",
                 "verbose": 0, **overrides}
    if isinstance(arguments["x"], str):  # "dataset": made here, in the test
        arguments["x"] = dataset()
    if arguments["model_fn"] == "a model":  # a built model where a function that builds one belongs
        arguments["model_fn"] = dense(3, compiled=False)
    with pytest.raises(UserError) as caught:
        tfdist.fit(arguments.pop("model_fn"), arguments.pop("x"), arguments.pop("y"), **arguments)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message


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
