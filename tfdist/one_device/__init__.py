"""Keras under a strategy computes one device's step: what both fits need, ``tfdist.fit`` and Keras' own ``fit``
across workers (``keras_fit``).

``install()`` is the one call both make before training. ``keras_fit.install`` calls it first, then checks Keras'
trainer, which an unknown Keras fails (the patch of Keras' own ``fit`` refuses); ``tfdist.fit`` does not use
Keras' trainer and must still train there, so it calls ``install()`` itself rather than through ``keras_fit``.
"""

from __future__ import annotations


def install() -> None:
    """Install, once per process (idempotent): ``central_storage`` (a metric's update adds each replica's examples
    once where variables live apart from the replicas), ``optimizer`` (the global batch's gradient applied once)
    and ``shares`` (losses, trackers and gradients weighed by each replica's share of the step's examples).

    Raises:
        UserError: this Keras' optimizer lacks a method the wrapping replaces or calls (``optimizer.check``).
    """
    from tfdist.one_device import central_storage, optimizer, shares

    central_storage.install()
    optimizer.install()
    shares.install()
