"""``tfdist.setup`` and ``tfdist.patch_keras``: a user's own Keras script, set up for a strategy and distributed."""

from __future__ import annotations

from tfdist import config as config_lib
from tfdist.errors import UserError, check_keras_backend
from tfdist.runtime import driver, serving, who


def setup(strategy: str = "auto", *, cpu_devices: int = 0, cluster: str | None = None,
          task: str | None = None, connect_timeout: float = 120.0, communication: str = "auto",
          bytes_per_pack: int = 0, collective_timeout: float = 0.0, progress_timeout: float = 1800.0,
          verbose: bool = True):
    """Set this process up for ``strategy`` and return the ``tf.distribute.Strategy``; call it first.

    The first line of a script, before any TensorFlow op: logical CPUs, the cluster and task, the
    collectives, then the strategy; and Keras' own ``fit`` made to work across workers (``patch_keras``).

        import tfdist
        strategy = tfdist.setup("multi_worker_mirrored")   # instead of tf.distribute.MultiWorkerMirroredStrategy()

    Args:
      strategy: one of ``tfdist.strategies.NAMES``, or ``"auto"``: the cluster's strategy under TF_CONFIG or
        ``cluster`` (``parameter_server`` with ps tasks, else ``multi_worker_mirrored``), ``mirrored`` with
        several GPUs or ``cpu_devices`` > 1, else ``one_device`` (``tfdist.config.resolve_strategy``).
      cpu_devices: logical CPUs for ``mirrored``/``central_storage`` without GPUs (0: 2).
      cluster, task: a cluster spec file (or ``"slurm"``) and this task (``"worker:1"``); default TF_CONFIG
        (e.g. under ``tfdist.launch``, Slurm or Kubernetes).
      connect_timeout: seconds to wait for the cluster's peers.
      communication, bytes_per_pack, collective_timeout: ``multi_worker_mirrored``'s all-reduce options.
      progress_timeout: seconds a worker's save waits for the chief's matching save (0: no bound); a
        ``tfdist.fit`` in the session takes its own.
      verbose: a serving task (ps, or a worker under ``parameter_server``) prints what it does.

    Returns:
      The strategy, to pass to ``tfdist.fit`` or to use as Keras' (``with strategy.scope():``). Called again
      with the same arguments (``verbose`` aside, and ``"auto"`` where it stands for the same strategy), the same
      strategy.

    Raises:
      UserError: a bad argument or cluster, a second set-up with other arguments (the line names each, as the
        call typed it), an evaluator task, or TensorFlow already started in a way the strategy cannot use.
    """
    check_keras_backend()
    runtime = config_lib.runtime_config(
        "tfdist.setup", strategy=strategy, cpu_devices=cpu_devices, cluster=config_lib.path_text(cluster),
        task="" if task is None else task, connect_timeout=connect_timeout, communication=communication,
        bytes_per_pack=bytes_per_pack, collective_timeout=collective_timeout, progress_timeout=progress_timeout)
    if not isinstance(verbose, (bool, int)):
        raise UserError(f"Invalid value for `verbose` of tfdist.setup. Received: verbose={verbose!r}. Expected a bool.")
    result = driver.setup(runtime, verbose=verbose)
    patch_keras()
    # After patch_keras' hooks: the serving tasks learn the script's status before a hook ends the process.
    serving.tell_servers_at_exit(who.current().placement)
    return result


def patch_keras() -> None:
    """Make Keras' own ``fit``/``evaluate``/``predict`` work across workers (keras-team/keras#20585).

    For a script that creates its own ``tf.distribute.MultiWorkerMirroredStrategy()``:
    ``import tfdist; tfdist.patch_keras()`` at its top. Idempotent.

    Raises:
      UserError: a Keras backend other than TensorFlow's, or a Keras whose trainer differs from the one the
        fix was made for.
    """
    check_keras_backend()
    from tfdist.fitting.api import fit
    from tfdist.keras_fit import install

    install(fit)
