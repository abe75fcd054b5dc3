"""Keras' own ``model.fit``, ``evaluate`` and ``predict`` across workers, under ``MultiWorkerMirroredStrategy``.

Keras 3's TensorFlow trainer fails with two or more workers (keras-team/keras#20585).
``install`` (``tfdist.patch_keras``, and ``tfdist.setup``) replaces the two
places that fail (``trainer``) and wraps ``fit`` so that, across workers,
file-writing callbacks write their real files on the chief only
(``callbacks``), a SIGTERM or SIGUSR1 on any worker stops every worker at the
same step and saves it (``preemption``), every worker returns once the chief's
files are written (``finish``), ``jit_compile=True`` on CPU is refused
(``xla``), ``steps_per_execution`` works (``executions``), a second
``MultiWorkerMirroredStrategy()`` is the first (``strategy_once``), a refusal
ends a script with one line (``user_errors``), and under tfdist's
``ParameterServerStrategy`` ``fit`` runs ``tfdist.fit``'s coordinator loop
(``parameter_server``). In one process or one worker, Keras runs untouched.
"""

from __future__ import annotations


def install() -> None:
    """Install the fix into Keras' TensorFlow trainer; idempotent.

    Raises:
        UserError: this Keras' trainer differs from the one the fix was made for.
    """
    from tfdist.fitting.patch import executions, strategy_once, trainer, user_errors

    trainer.install()
    executions.install()
    strategy_once.install()
    user_errors.install()
