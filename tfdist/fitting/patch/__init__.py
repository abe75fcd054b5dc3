"""Keras' own ``model.fit``, ``evaluate`` and ``predict`` across workers, under ``MultiWorkerMirroredStrategy``.

``install`` (``tfdist.patch_keras``, and ``tfdist.setup``) applies each fix of this package; in one process or one
worker, Keras runs untouched.
"""

from __future__ import annotations


def install() -> None:
    """Install the fix into Keras' TensorFlow trainer; idempotent.

    Raises:
        UserError: this Keras' trainer differs from the one the fix was made for.
    """
    from tfdist.fitting import global_gradients
    from tfdist.fitting.patch import executions, strategy_once, trainer, user_errors

    trainer.install()
    executions.install()
    strategy_once.install()
    user_errors.install()
    global_gradients.install()
