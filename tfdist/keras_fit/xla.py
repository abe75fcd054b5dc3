"""``compile(jit_compile=True)`` in Keras' own trainer over several CPU replicas.

Keras compiles its whole train and test step with XLA, ``strategy.run`` and the all-reduce of the gradients and
logs included, and XLA has no CPU implementation of the collectives, nor of a step that reads a replica's
variables from another CPU device. So there ``fit``'s and ``evaluate``'s steps (``train_on_batch``'s and
``test_on_batch``'s too) are made as plain ``tf.function``s: the same computation without XLA, said once
(``one_device.xla``). ``predict`` is left as Keras has it: it compiles each replica's forward pass alone, which
XLA runs on CPU.
"""

from __future__ import annotations

import functools

from tfdist import _compat
from tfdist.one_device.xla import cpu_replicas, proceed_without_xla


def install() -> None:
    """Make Keras' train and test steps over several CPU replicas without XLA (once per process)."""
    cls = _compat.keras_tensorflow_trainer().TensorFlowTrainer
    if getattr(cls.make_test_function, "tfdist_xla", False):
        return
    cls.make_train_function = _without_xla_on_cpu(cls.make_train_function, "Keras' train step")
    cls.make_test_function = _without_xla_on_cpu(cls.make_test_function, "Keras' test step")


def _without_xla_on_cpu(make_function, what: str):
    """``make_function`` that makes the step with ``jit_compile`` off where a replica is a CPU; the model's
    ``jit_compile`` reads True again afterwards."""

    @functools.wraps(make_function)
    def wrapped(self, force=False):
        cpus = cpu_replicas(self.distribute_strategy) if self.jit_compile is True else []
        if not cpus:
            return make_function(self, force)
        proceed_without_xla(self, what, f"it all-reduces across replicas on {', '.join(cpus)}, and XLA has no "
                                        "collectives for CPU devices")
        self.jit_compile = False
        try:
            return make_function(self, force)
        finally:
            self.jit_compile = True

    wrapped.tfdist_xla = True
    return wrapped
