"""``compile(jit_compile=True)`` in Keras' own trainer where XLA cannot compile its steps.

Keras compiles its whole train and test step with XLA, ``strategy.run`` and the all-reduce of the gradients and
logs included, and XLA has no CPU implementation of the collectives, nor reads a replica's variables kept on
another device (``central_storage``). There ``fit``'s, ``evaluate``'s and ``predict``'s steps (the ``on_batch``
methods' too) are made as plain ``tf.function``s: the same computation without XLA, said once
(``one_device.xla``). ``predict``'s step holds no collective, so over CPU replicas that keep their own copies
of the variables it keeps XLA.
"""

from __future__ import annotations

import functools

from tfdist import _compat
from tfdist.one_device import xla

#: Each step's maker, what it is called in the warning, and what it all-reduces inside the step.
STEPS = (("make_train_function", "Keras' train step", "the gradients and the logs"),
         ("make_test_function", "Keras' test step", "the logs"),
         ("make_predict_function", "Keras' predict step", None))


def install() -> None:
    """Make Keras' steps without XLA where XLA cannot compile them (once per process)."""
    cls = _compat.keras_tensorflow_trainer().TensorFlowTrainer
    if getattr(cls.make_test_function, "tfdist_xla", False):
        return
    for name, what, all_reduces in STEPS:
        setattr(cls, name, _without_xla_where_it_cannot(getattr(cls, name), what, all_reduces))


def _without_xla_where_it_cannot(make_function, what: str, all_reduces: str | None):
    """``make_function`` that makes the step with ``jit_compile`` off where XLA cannot compile it; the model's
    ``jit_compile`` reads True again afterwards."""

    @functools.wraps(make_function)
    def wrapped(self, force=False):
        if self.jit_compile is not True or xla.compiles(self, what, all_reduces=all_reduces):
            return make_function(self, force)
        self.jit_compile = False
        try:
            return make_function(self, force)
        finally:
            self.jit_compile = True

    wrapped.tfdist_xla = True
    return wrapped
