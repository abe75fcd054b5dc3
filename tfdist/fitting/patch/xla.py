"""``compile(jit_compile=True)`` in Keras' own ``fit`` over several CPU replicas: one line before training."""

from __future__ import annotations

from tfdist.errors import UserError


def refuse_on_cpu(model, strategy) -> None:
    """Refuse ``jit_compile=True`` when a replica of ``strategy`` runs on a CPU device.

    Raises:
        UserError: ``model.jit_compile`` is True and this worker's replicas include a CPU device.
    """
    if model.jit_compile is not True:
        return
    cpus = [d for d in strategy.extended.worker_devices if "CPU" in d.upper().rsplit("/", 1)[-1]]
    if cpus:
        raise UserError(
            "Invalid compile(jit_compile=True) for Keras' own fit over several replicas on CPU devices: XLA has no "
            "CPU implementation of the collectives that share gradients between replicas. Received: "
            f"jit_compile=True with replicas on {', '.join(cpus)}. Expected jit_compile=False (or 'auto', which "
            "Keras resolves to False under a distribution strategy) on CPU, or tfdist.fit, which compiles each "
            "replica's forward and backward pass and all-reduces outside it.")
