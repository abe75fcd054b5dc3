"""The public face: ``tfdist.fit``, ``setup``, ``patch_keras`` and ``saves_on_every_worker`` show their real signatures
without TensorFlow."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import tfdist

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_all_names_the_public_calls_and_each_has_its_real_signature():
    assert set(tfdist.__all__) == {"fit", "setup", "patch_keras", "saves_on_every_worker", "__version__"}
    fit = inspect.signature(tfdist.fit).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in fit.values())
    assert {"model_fn", "x", "y", "batch_size", "epochs", "strategy", "model_dir"} <= set(fit)
    setup = inspect.signature(tfdist.setup).parameters
    assert list(setup)[:4] == ["strategy", "cpu_devices", "cluster", "task"]
    assert not any(p.kind is p.VAR_KEYWORD for p in setup.values())


def test_each_argument_docs_fit_names_is_in_fits_signature():
    """The keywords of docs/fit.md's ``tfdist.fit(...)`` calls and the arguments its list names are parameters."""
    text = (DOCS / "fit.md").read_text()
    named = set()
    for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fit" \
                    and getattr(node.func.value, "id", "") == "tfdist":
                named |= {keyword.arg for keyword in node.keywords}
    listed = re.search(r"^- `x`/`y`:(.*?)^- ", text, re.DOTALL | re.MULTILINE).group(1)
    named |= set(re.findall(r"`([a-z_]+)`", listed.split("takes it.")[-1]))  # after the input forms
    assert {"batch_size", "validation_data", "progress_timeout"} <= named, named
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
