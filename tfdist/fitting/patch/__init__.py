"""Keras' own ``model.fit``, ``evaluate`` and ``predict`` across workers, under ``MultiWorkerMirroredStrategy``.

Keras 3's TensorFlow trainer fails with two or more workers (keras-team/keras#20585,
tensorflow/tensorflow#72388): it reduces a per-replica data batch across workers to build
the model symbolically, and reduces scalar logs "along axis 0". ``install``
(``tfdist.patch_keras``, and ``tfdist.setup``) replaces those two places
(``trainer``), and wraps ``fit`` so that, across workers:

- file-writing callbacks (``ModelCheckpoint``, ``TensorBoard``,
  ``BackupAndRestore``, ``CSVLogger``) write their real files on the chief
  only; the other workers write to a temporary directory of their own,
  removed when ``fit`` returns (``callbacks``);
- SIGTERM or SIGUSR1 on any worker stops every worker at the same step, saves
  that step through the ``BackupAndRestore`` callback and ends the process
  with status 42; the same command resumes (``preemption``);
- under the ``ParameterServerStrategy`` of ``tfdist.setup``, which Keras 3's
  ``fit`` has no path for, ``fit`` is trained by ``tfdist.fit``'s coordinator
  loop (``parameter_server``).

Everything else, in one process or one worker, is Keras' own code, untouched.
"""

from __future__ import annotations


def install() -> None:
    """Install the fix into Keras' TensorFlow trainer; idempotent.

    Raises:
        UserError: this Keras' trainer differs from the one the fix was made for.
    """
    from tfdist.fitting.patch import trainer

    trainer.install()
