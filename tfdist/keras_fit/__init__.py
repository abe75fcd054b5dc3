"""Keras' own ``model.fit``, ``evaluate`` and ``predict`` across replicas and workers, and a script's saves there.

``install`` (``tfdist.patch_keras``, ``tfdist.setup``, and ``tfdist.fit`` for the model it returns) installs what
both fits need (``one_device.install``), ``trainer`` and each fix of ``fixes.FIXES``, the one list of them; on one
replica, Keras runs untouched.
"""

from __future__ import annotations


def install(fit) -> None:
    """Install what both fits need (``one_device.install``), then the fixes of Keras' TensorFlow trainer:
    ``trainer``, then each of ``fixes.FIXES``; idempotent.

    Args:
        fit: ``tfdist.fit``, which trains Keras' own ``fit`` under a parameter-server strategy (passed in:
          ``tfdist.fit`` installs this package).

    Raises:
        UserError: this Keras' trainer (or optimizer) differs from the one the fix was made for.
    """
    from tfdist import one_device
    from tfdist.keras_fit import trainer
    from tfdist.keras_fit.fixes import FIXES

    one_device.install()
    trainer.install(fit)
    for fix in FIXES:
        if hasattr(fix, "install"):
            fix.install()
