"""A user's own training setup in the check: ``--model MODULE:FUNCTION`` names a function that returns
``(model_fn, x, y, fit_kwargs)``, trained in every mode beside Keras' one-device ``fit`` as a drawn case is.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys

from tfdist.errors import UserError

#: Rows of the user's data that ``evaluate`` and ``predict`` read after training.
HELD_OUT = 64


def _function(name: str):
    """The function ``MODULE:FUNCTION`` names: a module importable from the working directory, or a ``.py`` path."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute.isidentifier():
        raise UserError(f"Invalid value for `--model`. Received: {name!r}. Expected MODULE:FUNCTION, e.g. "
                        "my_model:setup or path/to/script.py:setup.")
    expected = "Expected MODULE:FUNCTION of a module on the path or a .py file."
    if module_name.endswith(".py"):
        problem = _not_a_file(module_name)
        if problem:
            raise UserError(f"Invalid value for `--model`: {module_name} is {problem}. Received: {name!r}. {expected}")
    try:
        if module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location("tfdist_check_user_model", module_name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"Invalid value for `--model`. Received: {name!r}, whose module cannot be imported "
                        f"({' '.join(str(e).split())[:200]}). {expected}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's module, run on import
        raise UserError(f"Invalid value for `--model`: importing {module_name} raised {type(e).__name__}"
                        f" ({' '.join(str(e).split())[:200]}). Received: {name!r}. Expected a module that imports "
                        "without error and defines FUNCTION.") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise UserError(f"Invalid value for `--model`. Received: {name!r}, and {module_name} has no function "
                        f"{attribute!r}. Expected MODULE:FUNCTION.")
    return function


def _not_a_file(path: str) -> str | None:
    """What ``path`` is when no module can be read from it ("not there", "a directory", a FIFO...), or None."""
    from tfdist.errors import special_file

    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "not there"
    except (OSError, ValueError) as e:
        return f"not readable ({getattr(e, 'strerror', None) or e})"
    if os.path.isdir(path):
        return "a directory"
    return special_file(path)


def check_name(name: str) -> None:
    """Refuse a ``--model`` whose function cannot be found, or whose setup is not one (``setup_of``), before any
    process starts (one line, status 2)."""
    setup_of(name)


#: ``fit`` arguments a setup's ``fit_kwargs`` may not hold: the check passes them itself (or a mode's strategy).
OWN_ARGUMENTS = ("x", "y", "model_fn", "strategy", "model_dir", "cluster", "task", "cluster_resolver", "cpu_devices")


def setup_of(name: str) -> tuple:
    """``(model_fn, x, y, fit_kwargs)`` of the function ``--model`` names, called and checked: a callable
    ``model_fn`` and a dict of keyword arguments that Keras' ``fit`` takes, without those of ``OWN_ARGUMENTS``.

    Raises:
      UserError: the function raises, needs arguments, or returns anything else (one line naming ``--model``).
    """
    import inspect

    function = _function(name)
    try:
        made = function()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's function
        raise UserError(f"Invalid value for `--model`: {name} raised {type(e).__name__} "
                        f"({' '.join(str(e).split())[:200]}). Received: {name!r}. Expected a function of no "
                        "arguments returning (model_fn, x, y, fit_kwargs).") from None
    if not (isinstance(made, tuple) and len(made) == 4 and callable(made[0]) and isinstance(made[3], dict)):
        what = (f"a {type(made).__name__}" if not isinstance(made, tuple) else f"a tuple of {len(made)}"
                if len(made) != 4 else f"a model_fn of {type(made[0]).__name__}" if not callable(made[0]) else
                f"fit_kwargs of {type(made[3]).__name__}, not a dict")
        raise UserError(f"Invalid value for `--model`. Received: {name!r}, which returns {what}. Expected a "
                        "function returning (model_fn, x, y, fit_kwargs): a function that builds and compiles the "
                        "model, the data, and a dict of Keras fit's keyword arguments.")
    if not made[3]:
        return made
    import keras

    known = inspect.signature(keras.Model.fit).parameters
    wrong = [k for k in made[3] if not isinstance(k, str) or k not in known or k in OWN_ARGUMENTS]
    if wrong:
        raise UserError(f"Invalid value for `--model`: its fit_kwargs hold {wrong[0]!r}, which "
                        f"{'the check passes itself' if wrong[0] in OWN_ARGUMENTS else 'Keras fit does not take'}. "
                        f"Received: {name!r}, returning fit_kwargs with keys {sorted(map(str, made[3]))}. Expected "
                        "keyword arguments of Keras' fit (batch_size, epochs, shuffle...), without x and y.")
    return made


@dataclasses.dataclass
class UserSetup:
    """A user's ``(model_fn, x, y, fit_kwargs)`` as the runs take a setup."""

    name: str

    def __post_init__(self):
        self._model_fn, self._x, self._y, self._kwargs = setup_of(self.name)

    def model_fn(self):
        return self._model_fn

    def fit_arguments(self):
        return self._x, self._y, {"verbose": 0, **self._kwargs}

    def held_out(self):
        import tensorflow as tf

        if isinstance(self._x, tf.data.Dataset):  # its own batches: (x, y) of the first ones
            x, y = next(iter(self._x.take(1)))[:2]
            return x, y, None
        take = lambda a: a[:HELD_OUT]  # noqa: E731
        return (tf.nest.map_structure(take, self._x), tf.nest.map_structure(take, self._y),
                self._kwargs.get("batch_size"))

    def describe(self) -> str:
        return f"{self.name}"
