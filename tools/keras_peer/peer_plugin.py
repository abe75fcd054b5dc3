"""pytest plugin of the Keras peer run: every test of an extracted Keras test tree in one strategy's scope.

``KERAS_PEER_MODE`` picks the strategy, set up once before any TensorFlow op of the session:

- ``one_device``: nothing (Keras' tests as they are);
- ``keras_mirrored``: CPU:0 split into 2 logical devices and TensorFlow's own ``MirroredStrategy`` over them;
- ``tfdist``: ``tfdist.setup("mirrored", cpu_devices=2)``, whose strategy it returns.

An autouse fixture enters the strategy's scope for each test, its ``setUp`` included, and again after each
``clear_session`` in it. Keras' tests import jax, torch, scipy and grain at their top for the cases of other
backends and input types; where one is not installed, the test modules get a placeholder instead, and a test
that reaches into one is skipped (with the module's name as the reason) rather than failing the file at import.
"""

import builtins
import importlib.util
import os
from pathlib import Path

import pytest

MODES = ("one_device", "keras_mirrored", "tfdist")
#: Packages that Keras' tests import for other backends and input types; absent here, they are placeheld.
OPTIONAL = ("jax", "torch", "scipy", "grain", "orbax")

_strategy = None
_MODE_KEY = pytest.StashKey[str]()


class _Absent:
    """An absent package as a test module sees it: any attribute is another placeholder; using one skips."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def _skip(self, *args, **kwargs):
        raise pytest.skip.Exception(f"needs {self._name.split('.')[0]} (not installed)", allow_module_level=True)

    __call__ = __iter__ = __mro_entries__ = __getitem__ = _skip

    def __instancecheck__(self, instance):  # nothing is an instance of a package that is not there
        return False

    def __subclasscheck__(self, cls):
        return False


def _placehold_absent_packages(tree: Path):
    """Give the modules under ``tree`` a placeholder for each package of ``OPTIONAL`` that is not installed; the
    library's own imports (Keras checks ``import torch`` to know what it may convert) still see it absent."""
    absent = {name for name in OPTIONAL if importlib.util.find_spec(name) is None}
    real_import = builtins.__import__

    def peer_import(name, globals=None, locals=None, fromlist=(), level=0):
        root = name.split(".")[0]
        if level == 0 and root in absent and globals and str(globals.get("__file__", "")).startswith(str(tree)):
            return _Absent(root)
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = peer_import


def _make_strategy(mode: str):
    """The strategy of ``mode``, made before any other TensorFlow op; None for ``one_device``."""
    if mode == "one_device":
        return None
    if mode == "tfdist":
        import tfdist

        return tfdist.setup("mirrored", cpu_devices=2)
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def pytest_configure(config):
    global _strategy
    mode = os.environ.get("KERAS_PEER_MODE", "one_device")
    if mode not in MODES:
        raise pytest.UsageError(f"Invalid KERAS_PEER_MODE. Received: {mode!r}. Expected one of {', '.join(MODES)}.")
    _placehold_absent_packages(Path(str(config.rootpath)).resolve())
    _strategy = _make_strategy(mode)
    if _strategy is not None:
        _keep_scope_across_graph_resets()
    config.stash[_MODE_KEY] = mode


def pytest_report_header(config):
    replicas = _strategy.num_replicas_in_sync if _strategy is not None else 1
    return f"keras peer: mode {config.stash[_MODE_KEY]}, strategy {type(_strategy).__name__}, {replicas} replicas"


class _Scope:
    """The strategy's scope over one test, ``setUp`` to last cleanup, kept across ``clear_session``.

    Keras' ``clear_session`` (every Keras ``setUp`` calls it) makes TensorFlow a new default graph, and a strategy's
    scope lives on the default graph: each new one gets the scope entered again, so the test's models, built in
    ``setUp`` or in its body, are the strategy's.
    """

    active = None

    def __init__(self, strategy):
        self.strategy, self.entered = strategy, None

    def enter(self):
        self.entered = self.strategy.scope()
        self.entered.__enter__()

    def __enter__(self):
        _Scope.active = self
        self.enter()
        return self

    def __exit__(self, *exc):
        _Scope.active = None
        try:
            self.entered.__exit__(None, None, None)
        except IndexError:  # a graph reset outside the patched call dropped it already
            pass


def _keep_scope_across_graph_resets():
    import tensorflow as tf

    reset = tf.compat.v1.reset_default_graph

    def reset_default_graph():
        reset()
        if _Scope.active is not None:
            _Scope.active.enter()

    tf.compat.v1.reset_default_graph = reset_default_graph


@pytest.fixture(autouse=True)
def _in_strategy_scope():
    """Each test, its ``setUp`` included, in the strategy's scope."""
    if _strategy is None:
        yield
        return
    with _Scope(_strategy):
        yield
