"""Keras' own ``model.fit``, ``evaluate`` and ``predict`` across workers, under ``MultiWorkerMirroredStrategy``.

Keras 3's TensorFlow trainer fails with two or more workers (keras-team/keras#20585).
``install`` (``tfdist.patch_keras``, and ``tfdist.setup``) replaces the two
places that fail (``trainer``) and wraps ``fit`` so that, across workers,
file-writing callbacks write their real files on the chief only
(``callbacks``), a SIGTERM or SIGUSR1 on any worker stops every worker at the
same step and saves it (``preemption``), and under tfdist's
``ParameterServerStrategy`` ``fit`` runs ``tfdist.fit``'s coordinator loop
(``parameter_server``). In one process or one worker, Keras runs untouched.
"""

from __future__ import annotations


def install() -> None:
    """Install the fix into Keras' TensorFlow trainer; idempotent.

    Raises:
        UserError: this Keras' trainer differs from the one the fix was made for.
    """
    from tfdist.fitting import global_gradients
    from tfdist.fitting.patch import trainer

    trainer.install()
    global_gradients.install()
