"""Keras' symbolic build of a model fed ``x`` alone (``fit(x)``, a Dataset of single tensors, ``train_on_batch(x)``).

Under a distribution strategy Keras builds the model before training from its data's type, and with it the
compiled loss and metrics, which it calls on the data's targets: with none (an autoencoder, a VAE whose own
``train_step`` computes its loss from ``x``) that is "None values not supported" before the first step. Keras'
``fit`` on one device never makes that call: its compiled loss and metrics stay as the model's own step leaves
them. Here the build makes the model and its optimizer and leaves a compiled loss and metrics that are not built
unbuilt, as one device does.
"""

from __future__ import annotations

import contextlib
import functools

from tfdist import _compat


def install() -> None:
    """Wrap Keras' TensorFlow trainer's symbolic build (once per process)."""
    cls = _compat.keras_tensorflow_trainer().TensorFlowTrainer
    if getattr(cls._symbolic_build, "tfdist_x_alone", False):
        return
    cls._symbolic_build = _without_targets(cls._symbolic_build)


def has_targets(data_batch) -> bool:
    """Whether a batch as Keras' ``fit`` hands it to a step (``x``, ``(x,)``, ``(x, y[, sample_weight])``) has
    targets."""
    import keras

    return keras.utils.unpack_x_y_sample_weight(data_batch)[1] is not None


@contextlib.contextmanager
def compiled_left_unbuilt(model):
    """While it runs, the model's compiled loss and metrics that are not built read as built, so that a build
    passes them by; after it they are unbuilt again."""
    unbuilt = [c for c in (_compat.compiled_loss(model), _compat.compiled_metrics(model))
               if c is not None and not c.built]
    for compiled in unbuilt:
        compiled.built = True
    try:
        yield
    finally:
        for compiled in unbuilt:
            compiled.built = False


def _without_targets(symbolic_build):
    """``_symbolic_build`` that, for a batch without targets, builds the model and its optimizer alone."""

    @functools.wraps(symbolic_build)
    def _symbolic_build(self, iterator=None, data_batch=None):
        if data_batch is None or has_targets(data_batch):
            return symbolic_build(self, iterator=iterator, data_batch=data_batch)
        with compiled_left_unbuilt(self):
            return symbolic_build(self, iterator=iterator, data_batch=data_batch)

    _symbolic_build.tfdist_x_alone = True
    return _symbolic_build
