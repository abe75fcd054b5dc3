"""tfdist: train a UNet, or any Keras 3 model, with every tf.distribute strategy, from one process to many hosts.

``fit``, ``setup`` and ``patch_keras`` are the calls of a user's script (``tfdist.fitting``); importing
``tfdist`` imports neither TensorFlow nor Keras, so that a CLI or ``setup`` can set the process up first.
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
