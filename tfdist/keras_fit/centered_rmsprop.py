"""``RMSprop(centered=True)`` on a sparse gradient (an ``Embedding``'s, a ``tf.gather``'s): one line, not a crash.

Keras' centered update subtracts the square of its ``IndexedSlices`` average from the velocity, and fails there
on one device too (an ``InvalidArgumentError`` of indices out of range in its union of the slices' rows), so no
number exists for replicas to equal. Its uncentered update of the same gradient trains, as on one device.
"""

from __future__ import annotations

import functools

from tfdist import _compat
from tfdist.errors import UserError


def install() -> None:
    """Wrap Keras' ``RMSprop.update_step`` (once per process)."""
    import keras

    cls = keras.optimizers.RMSprop
    if getattr(cls.update_step, "tfdist_centered", False):
        return
    cls.update_step = _refusing_sparse(cls.update_step)


def _refusing_sparse(update_step):
    @functools.wraps(update_step)
    def wrapped(self, gradient, variable, learning_rate):
        refuse_sparse(self, gradient, variable)
        return update_step(self, gradient, variable, learning_rate)

    wrapped.tfdist_centered = True
    return wrapped


def refuse_sparse(optimizer, gradient, variable) -> None:
    """Refuse a centered RMSprop's update of a sparse gradient, as its step is traced (one line).

    Raises:
        UserError: ``optimizer`` is centered and ``gradient`` is ``tf.IndexedSlices``.
    """
    import tensorflow as tf

    if getattr(optimizer, "centered", False) and isinstance(gradient, tf.IndexedSlices):
        name = getattr(variable, "path", None) or variable.name
        raise _compat.through_autograph(UserError(
            f"Invalid RMSprop(centered=True) for the sparse gradient of {name} (an Embedding's or a "
            "gather's): Keras' centered update of it fails on one device too. Received: centered=True and a "
            "sparse (IndexedSlices) gradient. Expected centered=False, which trains it as one device does, or "
            "another optimizer."))
