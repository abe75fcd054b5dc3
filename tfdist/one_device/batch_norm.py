"""The warning that several replicas normalize their own slices in ``BatchNormalization(synchronized=False)``:
``tfdist.fit`` and Keras' own ``fit`` (``keras_fit``) both say it."""

from __future__ import annotations

from tfdist import _compat


def warn_unsynchronized_batch_norm(model, replicas: int) -> None:
    """With several replicas, a ``BatchNormalization(synchronized=False)`` differs from one device: say so once."""
    import keras
    from absl import logging

    from tfdist.models import ReplicaBatchNorm

    if replicas < 2:
        return
    layers = [layer.name for layer in _compat.sublayers(model)
              if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized
              and not isinstance(layer, ReplicaBatchNorm)]  # it all-reduces its statistics itself
    if layers:
        logging.warning(
            "%d replicas and batch norm without synchronized=True (%s): each replica normalizes its own slice "
            "of the global batch, so training differs from one device. "
            "keras.layers.BatchNormalization(synchronized=True) all-reduces the statistics.",
            replicas, ", ".join(layers))

