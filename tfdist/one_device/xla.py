"""``compile(jit_compile=True)`` where XLA cannot compile a replica's step: the step runs without XLA.

XLA compiles each replica's step on its own device, and has no CPU implementation of the collectives: a step
that reads variables kept on another device (``central_storage``, the parameter servers), or that all-reduces
inside it over replicas on CPU devices, cannot be compiled. Both fits then run that step as a plain
``tf.function``, the same computation, and say so once, as Keras' own ``compile`` proceeds with
``jit_compile=False`` (and a warning) for a model XLA cannot take.
"""

from __future__ import annotations

import weakref

from tfdist.strategies import traits_of

#: model -> what has been said of it.
_SAID: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cpu_replicas(strategy) -> list[str]:
    """This worker's replica devices that are CPUs, where ``strategy`` has several replicas (else none)."""
    if strategy.num_replicas_in_sync < 2:
        return []
    return [d for d in strategy.extended.worker_devices if "CPU" in d.upper().rsplit("/", 1)[-1]]


def why_not(strategy, *, all_reduces: str | None = None) -> str | None:
    """Why XLA cannot compile a replica's step under ``strategy``, or None where it can.

    Args:
      strategy: the step's strategy.
      all_reduces: what the step all-reduces inside it (e.g. "the gradients"), or None: it holds no collective.
    """
    known = traits_of(strategy)
    if known is not None and known.variables_elsewhere and (known.coordinator or strategy.num_replicas_in_sync > 1):
        return (f"under {known.name} the variables are kept on another device than the replicas', and XLA "
                "compiles each replica's step on its own")
    cpus = cpu_replicas(strategy)
    if all_reduces and cpus:
        return (f"it all-reduces {all_reduces} inside the step over replicas on {', '.join(cpus)}, and XLA has no "
                "collectives for CPU devices")
    return None


def proceed_without_xla(model, what: str, why: str) -> None:
    """Say once per model that ``what`` runs without XLA, and ``why``."""
    from absl import logging

    said = _SAID.setdefault(model, set())
    if what in said:
        return
    said.add(what)
    logging.warning("compile(jit_compile=True): without XLA for %s (the same computation, as a plain tf.function): "
                    "%s.", what, why)


def compiles(model, what: str, *, all_reduces: str | None = None) -> bool:
    """Whether XLA can compile ``what``, a replica's step of ``model`` under its strategy; where it cannot, say
    why once (``proceed_without_xla``)."""
    why = why_not(model.distribute_strategy, all_reduces=all_reduces)
    if why is not None:
        proceed_without_xla(model, what, why)
    return why is None
