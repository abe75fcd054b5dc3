"""Keras' own ``model.fit``, ``evaluate`` and ``predict`` across replicas and workers, and a script's saves there.

``install`` (``tfdist.patch_keras``, ``tfdist.setup``, and ``tfdist.fit`` for the model it returns) applies each
fix of this package; on one replica, Keras runs untouched.
"""

from __future__ import annotations


def install(fit) -> None:
    """Install the fix into Keras' TensorFlow trainer; idempotent.

    Args:
        fit: ``tfdist.fit``, which trains Keras' own ``fit`` under a parameter-server strategy (passed in:
          ``tfdist.fit`` installs this package).

    Raises:
        UserError: this Keras' trainer differs from the one the fix was made for.
    """
    from tfdist.fitting import central_storage, global_gradients
    from tfdist.fitting.patch import executions, saving, strategy_once, trainer, user_errors, xla

    trainer.install(fit)
    executions.install()
    xla.install()
    strategy_once.install()
    saving.install()
    user_errors.install()
    global_gradients.install()
    central_storage.install()
