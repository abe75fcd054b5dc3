"""tfdist: train a UNet, or any Keras 3 model, with every tf.distribute strategy, from one process to many hosts.

Importing ``tfdist`` imports neither TensorFlow nor Keras; ``fit``, ``setup``, ``patch_keras`` and
``saves_on_every_worker`` load on first use.
"""

__version__ = "0.1.0"

__all__ = ["fit", "setup", "patch_keras", "saves_on_every_worker", "__version__"]

#: The public calls and their modules, each loaded when first asked for (PEP 562).
_API = {"fit": "tfdist.fitting.api", "setup": "tfdist.fitting.setup", "patch_keras": "tfdist.fitting.setup",
        "saves_on_every_worker": "tfdist.keras_fit.saving"}


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
