"""``compile(jit_compile=True)`` in Keras' own trainer over several CPU replicas.

Keras compiles its whole train and test step with XLA, ``strategy.run`` and the all-reduce of the logs
included, and XLA has no CPU implementation of the collectives, nor of a step that reads a replica's
variables from another CPU device. So ``fit`` is one line before training (its update needs the
all-reduce), and ``evaluate``'s step (``test_on_batch``'s too) runs as a plain ``tf.function``: the same
forward pass, loss and metrics, without XLA. ``predict`` is left as Keras has it: it compiles each
replica's forward pass alone, which XLA runs on CPU.
"""

from __future__ import annotations

import contextlib
import functools

from tfdist import _compat
from tfdist.errors import UserError


def cpu_replicas(strategy) -> list[str]:
    """This worker's replica devices that are CPUs, where ``strategy`` has several replicas (else none)."""
    if strategy.num_replicas_in_sync < 2:
        return []
    return [d for d in strategy.extended.worker_devices if "CPU" in d.upper().rsplit("/", 1)[-1]]


def refuse_on_cpu(model, strategy) -> None:
    """Refuse ``jit_compile=True`` in Keras' own ``fit`` when ``strategy`` has several replicas and one is a CPU.

    Raises:
        UserError: ``model.jit_compile`` is True and this worker's replicas include a CPU device.
    """
    if model.jit_compile is not True:
        return
    cpus = cpu_replicas(strategy)
    if cpus:
        raise UserError(
            "Invalid compile(jit_compile=True) for Keras' own fit over several replicas on CPU devices: XLA has no "
            "CPU implementation of the collectives that share gradients between replicas. Received: "
            f"jit_compile=True with replicas on {', '.join(cpus)}. Expected jit_compile=False (or 'auto', which "
            "Keras resolves to False under a distribution strategy) on CPU, or tfdist.fit, which compiles each "
            "replica's forward and backward pass and all-reduces outside it.")


@contextlib.contextmanager
def around(model, arguments, placement):
    """One Keras ``fit``: ``refuse_on_cpu`` before it runs."""
    refuse_on_cpu(model, model.distribute_strategy)
    yield


def install() -> None:
    """Make Keras' test step over several CPU replicas without XLA (once per process)."""
    cls = _compat.keras_tensorflow_trainer().TensorFlowTrainer
    if getattr(cls.make_test_function, "tfdist_xla", False):
        return
    cls.make_test_function = _test_step_without_xla_on_cpu(cls.make_test_function)


def _test_step_without_xla_on_cpu(make_test_function):
    """``make_test_function`` that makes the step with ``jit_compile`` off where a replica is a CPU; the model's
    ``jit_compile`` reads True again afterwards."""

    @functools.wraps(make_test_function)
    def wrapped(self, force=False):
        if self.jit_compile is not True or not cpu_replicas(self.distribute_strategy):
            return make_test_function(self, force)
        self.jit_compile = False
        try:
            return make_test_function(self, force)
        finally:
            self.jit_compile = True

    wrapped.tfdist_xla = True
    return wrapped
