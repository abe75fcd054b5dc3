"""A Keras backend other than TensorFlow's is one line, before Keras is imported: every CLI, tfdist.setup and fit.

Keras reads ``KERAS_BACKEND`` when it is imported; under ``jax`` or ``torch`` it failed deep inside Keras
(``tfdist.train``: a 48-line traceback). Each CLI here is refused by ``cli.run_main`` before its flags.
"""

from __future__ import annotations

import sys

import pytest

from helpers.clis import assert_user_error, run_cli, run_python
from tfdist import errors
from tfdist.errors import UserError

EXPECTED = (r"^error: Unsupported Keras backend: tfdist trains with the TensorFlow backend\. "
            r"Received: KERAS_BACKEND='{}'\. Expected KERAS_BACKEND=tensorflow")

CLIS = ["tfdist.train", "tfdist.tfconfig", "tfdist.launch", "tfdist.predict", "tfdist.bench", "tfdist.doctor"]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_every_cli_refuses_another_backend_in_one_line(tmp_path, backend):
    for module in CLIS:
        proc = run_cli(module, f"--model_dir={tmp_path / 'run'}", env={"KERAS_BACKEND": backend}, timeout=60)
        assert_user_error(proc, EXPECTED.format(backend))
    assert not (tmp_path / "run").exists()


API = """
import sys, tfdist
from tfdist.errors import UserError
for call in (lambda: tfdist.setup("one_device"), lambda: tfdist.fit(None), tfdist.patch_keras):
    try:
        call()
    except UserError as e:
        print(e)
print(sorted(m for m in ("keras", "tensorflow") if m in sys.modules))
"""


def test_setup_fit_and_patch_keras_refuse_another_backend_before_keras_is_imported():
    proc = run_python(API, env={"KERAS_BACKEND": "jax"}, timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 4, proc.stdout + proc.stderr
    assert all(line.startswith("Unsupported Keras backend") and "KERAS_BACKEND='jax'" in line for line in lines[:3])
    assert lines[3] == "[]"  # neither Keras nor TensorFlow was imported


@pytest.mark.parametrize("environ", [{}, {"KERAS_BACKEND": "tensorflow"}, {"KERAS_BACKEND": " "}])
def test_tensorflow_or_no_backend_is_accepted(environ):
    errors.check_keras_backend(environ)


def test_a_backend_named_in_the_environment_is_refused_by_name(monkeypatch):
    # Keras not yet imported (another test of this worker may have imported it): the environment decides.
    monkeypatch.delitem(sys.modules, "keras", raising=False)
    with pytest.raises(UserError, match=r"Received: KERAS_BACKEND='jax'\. Expected KERAS_BACKEND=tensorflow"):
        errors.check_keras_backend({"KERAS_BACKEND": "jax"})
