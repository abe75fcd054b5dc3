"""``tfdist.fit``: Keras' ``fit`` for any compiled Keras 3 model, under every strategy, across processes
(what a model must not do under a strategy: docs/fit.md).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile

from tfdist import config as config_lib
from tfdist import strategies
from tfdist.errors import Preempted, preempted_exit, UserError, check_keras_backend, short
from tfdist.fitting import patch
from tfdist.fitting.args import check_fit_args, check_run_args
from tfdist.rundir import RunDir
from tfdist.runtime import session as session_lib
from tfdist.runtime.lifecycle import training_task


def fit(model_fn, x=None, y=None, *, batch_size=None, epochs: int = 1, strategy=None,
        validation_data=None, validation_split: float = 0.0, validation_freq: int | list[int] = 1,
        steps_per_epoch: int | None = None, validation_steps: int | None = None,
        shuffle: bool = True, initial_epoch: int = 0, callbacks=None, verbose: int = 1, sample_weight=None,
        class_weight: dict | None = None, model_dir=None,
        cluster: str | None = None, task: str | None = None, cpu_devices: int = 0, seed: int | None = None,
        cluster_resolver=None, connect_timeout: float = 120.0, progress_timeout: float = 1800.0):
    """Train the model ``model_fn()`` builds and compiles, as Keras' ``model.fit`` would, under ``strategy``.

    Args:
      model_fn: ``() -> keras.Model``, compiled with an optimizer, a loss and metrics (Keras objects or names),
        or overriding ``train_step``/``test_step`` and compiled as its steps need; called inside the strategy's
        scope.
      x, y: numpy arrays (or nested structures of them) with one row per example; or ``x`` a
        ``tf.data.Dataset`` of ``(x, y)`` or ``(x, y, sample_weight)`` global batches; or ``x`` a
        ``dataset_fn(InputContext)`` returning this input pipeline's per-replica batches (as
        ``distribute_datasets_from_function`` takes it).
      batch_size: the global batch: examples per step over all replicas and workers (required for numpy and
        a ``dataset_fn``; a Dataset's own batches are global batches).
      epochs: the epoch to train to (Keras' meaning, with ``initial_epoch``).
      strategy: one of ``tfdist.strategies.NAMES``, ``"auto"``, or the ``tf.distribute.Strategy`` that
        ``tfdist.setup`` returned; default: the one ``tfdist.setup`` set this process up for, else ``"auto"``
        (a cluster's strategy under TF_CONFIG or ``cluster``, ``mirrored`` with several GPUs or
        ``cpu_devices`` > 1, else ``one_device``: ``tfdist.config.resolve_strategy``). After
        ``tfdist.setup``, ``strategy``, ``cpu_devices``, ``cluster`` and ``task`` are the session's (the process is
        set up once).
      validation_data: ``(x_val, y_val)``, ``(x_val, y_val, sample_weight_val)`` or a Dataset of global
        batches, evaluated after each epoch (each ``validation_freq``-th).
      validation_split: a fraction in [0, 1): the last rows of numpy ``x``, ``y`` and ``sample_weight`` (taken
        before any shuffling) validate instead of training, as in Keras (``floor(rows * (1 - split))`` rows
        train); ignored when ``validation_data`` is given; refused with a dataset ``x``.
      validation_freq: evaluate after every N-th epoch (an int), or after the epochs (counted from 1) of a
        list, as in Keras.
      steps_per_epoch: steps per epoch, a positive int (default: the whole of numpy data, or a finite Dataset).
      validation_steps: eval steps, a positive int (default: all of ``validation_data``).
      shuffle: shuffle numpy rows each epoch (the same order on every worker).
      initial_epoch: the epoch to start at when no checkpoint is restored.
      callbacks: Keras callbacks, run on every task that runs the training loop with the same global logs
        (epoch hooks; train-batch hooks when they have them), so that what they change (learning rate,
        weights, ``stop_training``) changes alike everywhere; their files are written by the chief alone.
      verbose: 0 silent; otherwise a line per epoch on the chief.
      sample_weight: numpy weights, one per row of ``x`` (Keras' meaning; numpy ``x`` only).
      class_weight: ``{class: weight}``: each example weighted by its class, as in Keras.
      model_dir: the run directory (checkpoints every epoch, resume, ``metrics.jsonl``, TensorBoard,
        heartbeats), as ``tfdist.train`` writes it; None: a temporary one, removed at the end (no resume).
      cluster, task: a cluster spec file and this task (``worker:1``), as for ``tfdist.train``; default
        TF_CONFIG (e.g. under ``tfdist.launch``, Slurm or Kubernetes).
      cpu_devices: logical CPUs for ``mirrored``/``central_storage`` without GPUs (0: 2).
      seed: if given, Keras' global seed (``keras.utils.set_random_seed``) right before ``model_fn``; the
        shuffle's seed (default 0), the same on every worker. Keras' precision policy is left as it is.
      cluster_resolver: an in-process cluster (``tfdist.deploy.in_process.in_process_cluster``), instead of TF_CONFIG.
      connect_timeout, progress_timeout: as ``--connect_timeout`` and ``--progress_timeout``.

    Returns:
      A ``keras.callbacks.History``: ``history`` holds each epoch's ``loss``, metrics and ``val_*`` (reduced
      over every replica and worker, as Keras defines them); ``model`` is the trained model. Every task
      returns the same figures; a serving task (ps, or a worker under ``parameter_server``) never returns. An
      ``evaluator`` task evaluates ``validation_data`` on each of the chief's checkpoints in ``model_dir`` and
      returns a History of those (``fitting.evaluator.evaluate_fit``).

    Raises:
      UserError: bad arguments (before the process is set up), a model without a loss, a metric or a loss
        reduction that does not add up, a model's own steps where they cannot run exactly, a cluster that
        does not fit the strategy, TensorFlow started before the set-up (``session.TOO_LATE``).
      PreemptedExit: a preemption (SIGTERM or SIGUSR1): the step reached is saved in ``model_dir`` after an
        ``error: Preempted at step N ...`` line; uncaught, the process ends with status 42, and the same call
        resumes there.
    """
    check_keras_backend()
    strategy = _strategy_name(strategy)
    source, validation = check_fit_args(
        model_fn, x, y, batch_size=batch_size, epochs=epochs, initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch, validation_data=validation_data, validation_steps=validation_steps,
        sample_weight=sample_weight, class_weight=class_weight, validation_split=validation_split,
        validation_freq=validation_freq)
    runtime = check_run_args(strategy=strategy or strategies.AUTO, cpu_devices=cpu_devices, cluster=cluster,
                             task=task, connect_timeout=connect_timeout, progress_timeout=progress_timeout, seed=seed,
                             model_dir=model_dir, shuffle=shuffle, verbose=verbose, callbacks=callbacks)
    if model_dir is not None:
        RunDir(model_dir).check_fit_resume({"batch_size": batch_size})
    session = session_lib.current()
    if session is not None:
        if runtime.strategy not in (strategies.AUTO, session.runtime.strategy):
            raise UserError(f"Invalid `strategy` for tfdist.fit after tfdist.setup. Received: strategy={strategy!r}, "
                            f"and the process is set up for {session.runtime.strategy!r}. Expected strategy=None, "
                            "'auto' or the set-up's own.")
        for name in ("cluster", "task"):
            given, fixed = getattr(runtime, name), getattr(session.runtime, name)
            if given and given != fixed:
                raise UserError(f"Invalid `{name}` for tfdist.fit after tfdist.setup. Received: {name}={given!r}, "
                                f"and the process is set up with {name}={fixed!r}. Expected {name}=None or the "
                                "set-up's own.")
        runtime = dataclasses.replace(session.runtime, progress_timeout=runtime.progress_timeout)
    else:
        runtime = config_lib.resolve_strategy(runtime, cluster_resolver)
    temporary = model_dir is None
    model_dir = tempfile.mkdtemp(prefix="tfdist-fit-") if temporary else str(model_dir)
    if session is not None:
        placement = session.placement
    else:
        placement = session_lib.place(runtime, in_process=cluster_resolver is not None)
    run_dir = RunDir(model_dir)  # written first by train_keras, once every argument is checked (fit.yaml)
    try:
        if placement.role == "evaluate":  # a side-car evaluator: it follows the chief's checkpoints
            from tfdist.fitting.evaluator import evaluate_fit

            return evaluate_fit(model_fn, source, validation, placement=placement,
                                model_dir=None if temporary else model_dir, batch_size=batch_size, epochs=epochs,
                                steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                                connect_timeout=runtime.connect_timeout, verbose=verbose)
        with training_task(runtime, placement, run_dir, where="tfdist.fit", cluster_resolver=cluster_resolver,
                           verbose=bool(verbose), keras_setup=False, session=session) as training:
            from tfdist.fitting import central_storage
            from tfdist.fitting.train import train_keras  # TensorFlow and Keras: once the process is set up

            central_storage.install()  # Keras' metric updates add each replica's examples once there
            _patch_keras()
            if seed is not None:
                import keras

                keras.utils.set_random_seed(seed)
            history = train_keras(
                model_fn, source, validation, training=training,
                batch_size=batch_size, epochs=epochs, validation_freq=validation_freq,
                steps_per_epoch=steps_per_epoch, validation_steps=validation_steps, shuffle=shuffle,
                initial_epoch=initial_epoch, callbacks=callbacks, verbose=verbose, seed=0 if seed is None else seed,
                keep_checkpoints=not temporary, class_weight=class_weight,
            )
        return history
    except Preempted as e:
        # As every tfdist task: the step reached is saved, and the process ends here with status 42 and one
        # line, so that a scheduler (or tfdist.launch) restarts the same command, which resumes from that step.
        sys.stdout.flush()
        sys.stderr.write(f"error: {e}\n")
        sys.stderr.flush()
        raise preempted_exit(str(e)) from None
    finally:
        if temporary:
            shutil.rmtree(model_dir, ignore_errors=True)


def _patch_keras() -> None:
    """Make Keras' own ``fit``, ``evaluate`` and ``predict`` work on the model ``fit`` returns (``patch.install``).

    Its model lives under ``fit``'s strategy, where Keras' own trainer fails across workers without the patch.
    ``fit``'s own loop does not use Keras' trainer, so on a Keras whose trainer differs from the one the patch
    was made for, ``fit`` trains all the same and a warning says that Keras' calls are left as they are.
    """
    from absl import logging

    try:
        patch.install(fit)
    except UserError as e:
        logging.warning("tfdist.fit trains, but leaves Keras' own fit, evaluate and predict on the model it returns "
                        "as this Keras has them: %s", e)


def _strategy_name(strategy):
    """``fit``'s ``strategy`` as a name: the Strategy ``tfdist.setup`` returned stands for its session's."""
    if not (hasattr(strategy, "scope") and hasattr(strategy, "num_replicas_in_sync")):
        return strategy  # a name, or a value that check_run_args refuses
    session = session_lib.current()
    if session is not None and strategy is session.strategy:
        return session.runtime.strategy
    raise UserError(f"Invalid `strategy` for tfdist.fit. Received: {type(strategy).__name__} {short(strategy, 60)}, "
                    "which tfdist.setup did not return. Expected a strategy name (one of "
                    f"{', '.join(config_lib.STRATEGIES)}) or the Strategy that tfdist.setup returned.")

