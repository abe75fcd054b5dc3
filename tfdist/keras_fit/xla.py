"""``compile(jit_compile=True)`` in Keras' own trainer where XLA cannot compile its steps.

Keras compiles its whole train and test step with XLA, ``strategy.run`` and the all-reduce of the gradients and
logs included, and XLA has no CPU implementation of the collectives, nor reads a replica's variables kept on
another device (``central_storage``). There ``fit``'s, ``evaluate``'s and ``predict``'s steps (the ``on_batch``
methods' too) are made as plain ``tf.function``s: the same computation without XLA, said once
(``one_device.xla``). ``predict``'s step holds no collective, so over CPU replicas that keep their own copies
of the variables it keeps XLA, once the model is built: over several replicas XLA cannot create the variables
of a model that ``predict`` builds ("failed to lift variable creations"), so its first step is made without
XLA, and made again with XLA by the next ``predict`` (one device builds in its XLA step).
"""

from __future__ import annotations

import functools
import weakref

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
    cls.make_predict_function = _without_xla_while_unbuilt(cls.make_predict_function)


def _without_xla_where_it_cannot(make_function, what: str, all_reduces: str | None):
    """``make_function`` that makes the step with ``jit_compile`` off where XLA cannot compile it; the model's
    ``jit_compile`` reads True again afterwards."""

    @functools.wraps(make_function)
    def wrapped(self, force=False):
        if self.jit_compile is not True or xla.compiles(self, what, all_reduces=all_reduces):
            return make_function(self, force)
        return _made_without_xla(self, make_function, force)

    wrapped.tfdist_xla = True
    return wrapped


def _without_xla_while_unbuilt(make_predict_function):
    """``make_predict_function`` that makes the step without XLA while the model is not built over several
    replicas, and again (with XLA) once it is."""

    @functools.wraps(make_predict_function)
    def wrapped(self, force=False):
        if self.jit_compile is not True or self.distribute_strategy.num_replicas_in_sync < 2:
            return make_predict_function(self, force)
        if not self.built:
            _UNBUILT.add(self)
            return _made_without_xla(self, make_predict_function, force)
        if self in _UNBUILT:
            _UNBUILT.discard(self)
            force = True
        return make_predict_function(self, force)

    return wrapped


#: The models whose predict step was made before they were built, without XLA.
_UNBUILT: weakref.WeakSet = weakref.WeakSet()


def _made_without_xla(model, make_function, force):
    """``make_function(model, force)`` with the model's ``jit_compile`` off while it runs."""
    model.jit_compile = False
    try:
        return make_function(model, force)
    finally:
        model.jit_compile = True
