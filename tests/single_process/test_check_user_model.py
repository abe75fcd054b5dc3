"""``python -m tfdist.check --model FILE:FUNCTION``: a user's own setup against Keras' one-device ``fit``.

A model with plain ``BatchNormalization`` normalizes each replica's slice on its own, so two replicas differ
from one device: the check reports it as differing, with the command that runs it alone, and ends with status 1,
while the same model on one device is equal.
"""

from __future__ import annotations

import pytest

from helpers.clis import run_cli

SETUP = '''
import numpy as np

def setup():
    import keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 5)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")

    def model_fn():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8), keras.layers.BatchNormalization(),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return model_fn, x, y, {"batch_size": 32, "epochs": 2, "shuffle": False}
'''


@pytest.mark.slow
def test_a_users_setup_that_differs_on_two_replicas_is_reported_with_the_command_that_repeats_it(tmp_path):
    (tmp_path / "user_model.py").write_text(SETUP)
    proc = run_cli("tfdist.check", "--model", "user_model.py:setup", "--modes", "one_device,mirrored",
                   timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "one_device: 1 equal" in proc.stdout
    assert "differs  mirrored on local: user_model.py:setup" in proc.stdout
    assert "alone: python -m tfdist.check --model user_model.py:setup --modes mirrored" in proc.stdout


def test_a_setup_whose_fit_kwargs_keras_fit_does_not_take_is_one_line_with_status_2(tmp_path):
    """The setup is called before any process starts: fit_kwargs with a name Keras' fit does not take ('epoch'),
    or one the check passes itself ('x'), is one line naming --model, with nothing written."""
    from helpers.clis import assert_user_error

    (tmp_path / "misnamed.py").write_text(SETUP.replace('"epochs": 2', '"epoch": 2'))
    (tmp_path / "own.py").write_text(SETUP.replace('"epochs": 2', '"x": x'))
    before = sorted(p.name for p in tmp_path.iterdir())
    for name, match in (("misnamed", r"`--model`: its fit_kwargs hold 'epoch', which Keras fit does not take"),
                        ("own", r"`--model`: its fit_kwargs hold 'x', which the check passes itself")):
        proc = run_cli("tfdist.check", "--model", f"{name}.py:setup", "--modes", "one_device", timeout=300,
                       cwd=tmp_path)
        assert_user_error((proc.returncode, proc.stdout, proc.stderr), match)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == before
