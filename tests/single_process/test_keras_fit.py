"""The Keras fix in one process: a parameter server strategy tfdist did not make, a Keras whose trainer differs, set-up's place and once per process."""

from __future__ import annotations

import types

import numpy as np
import pytest

from helpers.models import source


PS_REFUSED = source() + """
import numpy as np
import tfdist
from tfdist.deploy.in_process import in_process_cluster
tfdist.patch_keras()
import keras, tensorflow as tf
strategy = tf.distribute.ParameterServerStrategy(in_process_cluster(num_workers=1, num_ps=1))
with strategy.scope():
    model = dense(2)
try:
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), epochs=1, verbose=0)
except tfdist.errors.UserError as e:
    print("REFUSED", e)
"""


def printed_line(python, code: str, tag: str) -> str:
    """The line a script printed after ``tag`` (what a tfdist error said), once it ended well."""
    result = python(code, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split(f"{tag} ", 1)[1].strip()


def test_keras_fit_under_a_parameter_server_strategy_tfdist_did_not_make_is_refused_with_one_line(python):
    line = printed_line(python, PS_REFUSED, "REFUSED")
    assert line.startswith("Invalid strategy for Keras' own model.fit: Keras 3 has no ParameterServerStrategy path")
    assert "tfdist.setup('parameter_server')" in line and "\n" not in line


def test_the_fix_refuses_a_keras_whose_trainer_differs():
    from tfdist.errors import UserError
    from tfdist import _compat
    from tfdist.keras_fit import trainer

    real = _compat.keras_tensorflow_trainer()
    trainer.check(real)  # the Keras installed here is the one the fix is made for

    def reduce_per_replica(values, strategy, reduction):
        return strategy.reduce("MEAN", values, axis=None)  # a Keras that fixed it its own way

    other = types.SimpleNamespace(TensorFlowTrainer=real.TensorFlowTrainer, reduce_per_replica=reduce_per_replica,
                                  _collective_all_reduce_multi_worker=real._collective_all_reduce_multi_worker)
    with pytest.raises(UserError, match=r"^Unsupported Keras .* differs in reduce_per_replica\. Received: keras "):
        trainer.check(other)
    without_build = types.SimpleNamespace(TensorFlowTrainer=object, reduce_per_replica=real.reduce_per_replica,
                                          _collective_all_reduce_multi_worker=None)
    with pytest.raises(UserError, match="differs in _maybe_symbolic_build, _symbolic_build, "
                                        "_collective_all_reduce_multi_worker, fit"):
        trainer.check(without_build)


def test_install_itself_refuses_a_trainer_that_reads_otherwise_and_changes_nothing(monkeypatch):
    """``install()`` (not only ``check``) refuses a trainer module whose ``reduce_per_replica`` differs.

    The stand-in module has the real trainer's parts, unpatched, but a ``reduce_per_replica`` of its own; an
    ``install`` that skipped the check would replace its functions and wrap its ``fit``.
    """
    import inspect

    from tfdist import _compat
    from tfdist.errors import UserError
    from tfdist.keras_fit import trainer

    real = _compat.keras_tensorflow_trainer()

    def reduce_per_replica(values, strategy, reduction):
        return strategy.reduce("MEAN", values, axis=None)  # a Keras that fixed it its own way

    stand_in_class = type("TensorFlowTrainer", (), {
        name: inspect.unwrap(getattr(real.TensorFlowTrainer, name))
        for name in ("_maybe_symbolic_build", "_symbolic_build", "fit", "_make_function", "make_train_function",
                     "make_test_function", "make_predict_function")})
    stand_in = types.SimpleNamespace(TensorFlowTrainer=stand_in_class, reduce_per_replica=reduce_per_replica,
                                     _collective_all_reduce_multi_worker=real._collective_all_reduce_multi_worker)
    before = {**vars(stand_in), **dict(vars(stand_in_class))}
    monkeypatch.setattr(_compat, "keras_tensorflow_trainer", lambda: stand_in)
    with pytest.raises(UserError) as caught:
        trainer.install(fit=None)
    assert str(caught.value).startswith("Unsupported Keras ") and "\n" not in str(caught.value)
    assert "differs in reduce_per_replica. Received: keras " in str(caught.value)
    assert {**vars(stand_in), **dict(vars(stand_in_class))} == before  # nothing replaced, nothing wrapped


TOO_LATE = """
import tensorflow as tf
tf.constant(1.0) + 1.0   # a dataset, a model, any op: TensorFlow starts here
import tfdist
try:
    tfdist.setup("mirrored", cpu_devices=2)
except tfdist.errors.UserError as e:
    print("LINE", e)
"""


TWICE = """
import tfdist
first = tfdist.setup("one_device")
assert tfdist.setup("one_device") is first
try:
    tfdist.setup("mirrored")
except tfdist.errors.UserError as e:
    print("LINE", e)
"""


def test_setup_after_tensorflow_started_says_to_move_it_to_the_top(python):
    line = printed_line(python, TOO_LATE, "LINE")
    assert line.startswith("Invalid set-up order for strategy='mirrored': TensorFlow had already started. "
                           "Received: Cannot split the CPU into 2 logical devices"), line
    assert "call it at the top of the script" in line and "Preempt" not in line


def test_setup_is_once_per_process(python):
    line = printed_line(python, TWICE, "LINE")
    assert line.startswith("Invalid second tfdist.setup: this process is already set up for strategy='one_device'.")



BATCH_NORM = """
import sys
import numpy as np
import tfdist
strategy = tfdist.setup("mirrored", cpu_devices=2)
import keras
for synchronized in (False, True):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4),
                                  keras.layers.BatchNormalization(synchronized=synchronized, name=f"bn_{synchronized}"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    print(f"FIT synchronized={synchronized}", file=sys.stderr, flush=True)  # among absl's lines
    model.fit(np.ones((16, 4)), np.ones((16, 1)), batch_size=8, epochs=2, verbose=0,
              validation_data=(np.ones((8, 4)), np.ones((8, 1))))
print("DONE", file=sys.stderr, flush=True)
"""


def test_keras_fit_after_setup_warns_once_per_fit_of_batch_norm_each_replica_normalizes_on_its_own(python):
    # As tfdist.fit warns: over 2 replicas, a plain BatchNormalization differs from one device.
    result = python(BATCH_NORM, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    plain, synchronized = result.stderr.split("FIT synchronized=False", 1)[1].split("FIT synchronized=True", 1)
    warning = "2 replicas and batch norm without synchronized=True (bn_False): each replica normalizes its own slice"
    assert plain.count(warning) == 1, plain[-3000:]
    assert "DONE" in synchronized and "batch norm without synchronized=True" not in synchronized, synchronized[-3000:]


JIT_EVALUATE = source() + """
import json
import numpy as np
import tfdist
import keras

rng = np.random.default_rng(0)
x = rng.normal(size=(97, 8)).astype("float32")   # 97 rows: the last batch of 32 splits 1/0 over 2 replicas
y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64")


def model_fn():
    return dense(8, 2, hidden=(16,), seed=1, optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                 jit_compile=True, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def figures(model):
    return {"evaluate": model.evaluate(x, y, verbose=0), "evaluate_dict": model.evaluate(x, y, return_dict=True,
            verbose=0), "predict": model.predict(x, verbose=0).tolist(), "jit_compile": model.jit_compile}


history = tfdist.fit(model_fn, x, y, batch_size=32, epochs=2, strategy="mirrored", cpu_devices=2, verbose=0)
model = history.model
replicas = model.distribute_strategy.num_replicas_in_sync
two = figures(model)
one_device = model_fn()   # outside any strategy's scope: one device, compiled with XLA
one_device.set_weights(model.get_weights())

# A model that Keras' predict builds: over 2 replicas XLA cannot create its variables in the step.
with model.distribute_strategy.scope():
    unbuilt = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])
    unbuilt.compile(loss="mse", jit_compile=True)
    built_by_predict = unbuilt.predict(x, verbose=0)
    again = unbuilt.predict(x, verbose=0)
plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)])
plain.compile(loss="mse", jit_compile=True)
plain.set_weights(unbuilt.get_weights())
unbuilt_figures = {"first": built_by_predict.tolist(), "again": again.tolist(),
                   "one_device": plain.predict(x, verbose=0).tolist()}
print("RESULT " + json.dumps({"replicas": replicas, "two": two, "one_device": figures(one_device),
                              "unbuilt": unbuilt_figures}))
"""


def test_keras_evaluate_and_predict_after_a_jit_compiled_tfdist_fit_on_two_cpus_equal_one_device(python):
    # Keras compiles its whole test step with XLA, which cannot read replica 1's variables from CPU:0: the patch
    # runs that step without XLA there, the same forward pass, loss and metrics.
    import json

    result = json.loads(printed_line(python, JIT_EVALUATE, "RESULT"))
    two, one_device = result["two"], result["one_device"]
    assert result["replicas"] == 2
    assert two["jit_compile"] is True and one_device["jit_compile"] is True  # the model's setting is left as given
    assert sorted(two["evaluate_dict"]) == ["accuracy", "loss"]
    for key in ("evaluate", "evaluate_dict"):
        # One device sums the examples in another order: within 1e-7 relative here.
        assert two[key] == pytest.approx(one_device[key], rel=1e-6), (key, two[key], one_device[key])
    np.testing.assert_allclose(two["predict"], one_device["predict"], rtol=1e-6)
    # Keras' predict builds a model compiled with XLA over 2 replicas (its first step without XLA), and predicts
    # again with XLA: as one device (XLA's fused sums and TensorFlow's round 1.3e-7 apart here).
    unbuilt = result["unbuilt"]
    np.testing.assert_allclose(unbuilt["first"], unbuilt["one_device"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(unbuilt["again"], unbuilt["one_device"], rtol=1e-5, atol=1e-6)


OTHER_TRAINER = source() + """
import numpy as np
import tfdist
from tfdist.errors import UserError
from tfdist.keras_fit import trainer


def check(module):
    raise UserError("Unsupported Keras for tfdist's fix of Keras' own fit across workers: a stand-in.")


trainer.check = check   # a Keras whose trainer differs from the one the patch was made for
import keras


def model_fn():
    return dense(2)


x = np.arange(32, dtype="float32").reshape(16, 2) / 32
history = tfdist.fit(model_fn, x, x[:, :1], batch_size=8, epochs=2, strategy="one_device", verbose=0)
print("LOSSES", len(history.history["loss"]), history.model.evaluate(x, x[:, :1], verbose=0) > 0)
from tfdist import _compat
from tfdist.one_device import central_storage, shares

print("ONE_DEVICE", getattr(keras.Variable.assign, central_storage.MARK, False),
      getattr(_compat.keras_loss_module().scale_loss_for_distribution, shares.MARK, False),
      getattr(_compat.keras_tensorflow_optimizer().apply, "_tfdist", False))
"""


def test_tfdist_fit_on_a_keras_whose_trainer_differs_trains_and_says_keras_calls_are_left_as_they_are(python):
    # tfdist.fit's own loop does not use Keras' trainer: the refusal of the patch is a warning there, not a stop,
    # and what both fits need (one_device.install) is installed all the same.
    result = python(OTHER_TRAINER, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("LOSSES ", 1)[1].split()[:2] == ["2", "True"], result.stdout[-2000:]
    assert result.stdout.split("ONE_DEVICE ", 1)[1].split()[:3] == ["True"] * 3, result.stdout[-2000:]
    warning = ("tfdist.fit trains, but leaves Keras' own fit, evaluate and predict on the model it returns as this "
               "Keras has them: Unsupported Keras for tfdist's fix of Keras' own fit across workers: a stand-in.")
    assert result.stderr.count(warning) == 1, result.stderr[-3000:]
