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
    try:
        if module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location("tfdist_check_user_model", module_name)
            if spec is None or not os.path.isfile(module_name):
                raise ImportError(f"no file {module_name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"Invalid value for `--model`. Received: {name!r}, whose module cannot be imported "
                        f"({e}). Expected MODULE:FUNCTION of a module on the path or a .py file.") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise UserError(f"Invalid value for `--model`. Received: {name!r}, and {module_name} has no function "
                        f"{attribute!r}. Expected MODULE:FUNCTION.")
    return function


def check_name(name: str) -> None:
    """Refuse a ``--model`` whose function cannot be found before any process starts (one line, status 2)."""
    _function(name)


@dataclasses.dataclass
class UserSetup:
    """A user's ``(model_fn, x, y, fit_kwargs)`` as the runs take a setup."""

    name: str

    def __post_init__(self):
        made = _function(self.name)()
        if not (isinstance(made, tuple) and len(made) == 4 and callable(made[0]) and isinstance(made[3], dict)):
            raise UserError(f"Invalid value for `--model`. Received: {self.name!r}, which returns a "
                            f"{type(made).__name__}. Expected a function returning (model_fn, x, y, fit_kwargs).")
        self._model_fn, self._x, self._y, self._kwargs = made

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
