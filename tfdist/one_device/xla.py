"""``compile(jit_compile=True)`` where XLA cannot compile a replica's step: the step runs without XLA.

XLA has no CPU implementation of the collectives, and compiles each replica's step on its own device, so a step
that all-reduces inside it over CPU replicas, or reads variables kept on another device, cannot be compiled.
Both fits then run that step as a plain ``tf.function``, the same computation, and say so once, as Keras' own
``compile`` proceeds with ``jit_compile=False`` (and a warning) for a model XLA cannot take.
"""

from __future__ import annotations

import weakref

#: model -> what has been said of it.
_SAID: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cpu_replicas(strategy) -> list[str]:
    """This worker's replica devices that are CPUs, where ``strategy`` has several replicas (else none)."""
    if strategy.num_replicas_in_sync < 2:
        return []
    return [d for d in strategy.extended.worker_devices if "CPU" in d.upper().rsplit("/", 1)[-1]]


def proceed_without_xla(model, what: str, why: str) -> None:
    """Say once per model that ``what`` runs without XLA, and ``why``."""
    from absl import logging

    said = _SAID.setdefault(model, set())
    if what in said:
        return
    said.add(what)
    logging.warning("compile(jit_compile=True): without XLA for %s (the same computation, as a plain tf.function): "
                    "%s.", what, why)
