"""The public face: ``tfdist.fit``, ``setup`` and ``patch_keras`` show their real signatures without TensorFlow."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import tfdist

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_all_names_the_public_calls_and_each_has_its_real_signature():
    assert set(tfdist.__all__) == {"fit", "setup", "patch_keras", "__version__"}
    fit = inspect.signature(tfdist.fit).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in fit.values())
    assert {"model_fn", "x", "y", "batch_size", "epochs", "strategy", "model_dir"} <= set(fit)
    setup = inspect.signature(tfdist.setup).parameters
    assert list(setup)[:4] == ["strategy", "cpu_devices", "cluster", "task"]
    assert not any(p.kind is p.VAR_KEYWORD for p in setup.values())


def test_each_argument_docs_fit_names_is_in_fits_signature():
    """Every ``name=`` docs/fit.md passes to ``tfdist.fit(...)`` is a parameter of it."""
    text = (DOCS / "fit.md").read_text()
    calls = re.findall(r"tfdist\.fit\(([^)]*(?:\([^)]*\)[^)]*)*)\)", text)
    named = {name for call in calls for name in re.findall(r"\b([a-z_]+)=", call)}
    assert named, "docs/fit.md shows no call of tfdist.fit with named arguments"
    assert named <= set(inspect.signature(tfdist.fit).parameters), named - set(inspect.signature(tfdist.fit).parameters)


def test_each_call_has_args_and_returns_or_raises_in_its_docstring():
    for call in (tfdist.fit, tfdist.setup):
        doc = inspect.getdoc(call)
        assert "Args:" in doc and "Returns:" in doc and "Raises:" in doc, call.__name__
    assert "Raises:" in inspect.getdoc(tfdist.patch_keras)


def test_an_unknown_attribute_is_an_attribute_error():
    try:
        tfdist.train_everything  # noqa: B018
    except AttributeError as e:
        assert "train_everything" in str(e)
    else:
        raise AssertionError("tfdist.train_everything did not raise AttributeError")
