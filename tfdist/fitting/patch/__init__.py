"""Keras' own ``model.fit``, ``evaluate`` and ``predict`` across workers, under ``MultiWorkerMirroredStrategy``.

Keras 3's TensorFlow trainer fails with two or more workers (keras-team/keras#20585).
``install`` (``tfdist.patch_keras``, and ``tfdist.setup``) replaces the two
places that fail (``trainer``), makes ``steps_per_execution`` work
(``executions``) and a second strategy the first (``strategy_once``), and wraps
``fit``: chief-only files (``callbacks``), preemption (``preemption``), a
barrier at the end (``finish``), ``jit_compile`` on CPU refused (``xla``),
``parameter_server`` (``parameter_server``). A script's uncaught refusal is one
line (``user_errors``). In one process or one worker, Keras runs untouched.
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
