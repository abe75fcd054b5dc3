"""tfdist: train a UNet, or any Keras 3 model, with every tf.distribute strategy, from one process to many hosts.

Importing ``tfdist`` imports neither TensorFlow nor Keras; ``fit``, ``setup`` and ``patch_keras`` load on first use.
"""

__version__ = "0.1.0"

__all__ = ["fit", "setup", "patch_keras", "__version__"]

#: The public calls and their modules, each loaded when first asked for (PEP 562).
_API = {"fit": "tfdist.fitting.api", "setup": "tfdist.fitting.setup", "patch_keras": "tfdist.fitting.setup"}


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
