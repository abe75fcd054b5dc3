"""``tfdist.fit``: Keras' ``fit`` for any compiled Keras 3 model, under every strategy, across processes
(what a model must not do under a strategy: docs/fit.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import sys
import tempfile
from typing import Any, Callable

from tfdist import strategies
from tfdist.engine.client import Client
from tfdist.engine.controller import Schedule
from tfdist.engine.plan import Plan
from tfdist.errors import Preempted, preempted_exit, UserError, check_keras_backend
from tfdist import keras_fit
from tfdist.fitting.args import check_fit_args, check_run_args, keras_shuffle, python_int, strategy_name
from tfdist.fitting.class_weight import keras_class_weight
from tfdist.rundir import RunDir
from tfdist.runtime import driver


def fit(model_fn, x=None, y=None, *, batch_size=None, epochs: int = 1, strategy=None,
        validation_data=None, validation_split: float = 0.0, validation_freq: int | list[int] = 1,
        steps_per_epoch: int | None = None, validation_steps: int | None = None,
        shuffle: bool | str = True, initial_epoch: int = 0, callbacks=None, verbose: int = 1, sample_weight=None,
        class_weight: dict | None = None, model_dir=None,
        cluster: str | None = None, task: str | None = None, cpu_devices: int = 0, seed: int | None = None,
        cluster_resolver=None, connect_timeout: float = 120.0, progress_timeout: float = 1800.0):
    """Train the model ``model_fn()`` builds and compiles, as Keras' ``model.fit`` would, under ``strategy``.

    Args:
      model_fn: ``() -> keras.Model``, compiled with an optimizer, a loss and metrics (Keras objects or names),
        or overriding ``train_step``/``test_step`` and compiled as its steps need; called inside the strategy's
        scope.
      x, y: numpy arrays (or nested structures of them) with one row per example; or ``x`` a
        ``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a Python generator of ``(x, y)`` or
        ``(x, y, sample_weight)`` global batches (the latter two read by Keras' own data adapter); or ``x`` a
        ``dataset_fn(InputContext)`` returning this input pipeline's per-replica batches (as
        ``distribute_datasets_from_function`` takes it).
      batch_size: the global batch: examples per step over all replicas and workers (required for numpy and
        a ``dataset_fn``; a Dataset's, PyDataset's or generator's own batches are global batches, and
        ``batch_size`` is ignored there, as in Keras).
      epochs: the epoch to train to (Keras' meaning, with ``initial_epoch``).
      strategy: one of ``tfdist.strategies.NAMES``, ``"auto"``, or the ``tf.distribute.Strategy`` that
        ``tfdist.setup`` returned; default: the one ``tfdist.setup`` set this process up for, else ``"auto"``
        (a cluster's strategy under TF_CONFIG or ``cluster``, ``mirrored`` with several GPUs or
        ``cpu_devices`` > 1, else ``one_device``: ``tfdist.config.resolve_strategy``). After
        ``tfdist.setup``, ``strategy``, ``cpu_devices``, ``cluster`` and ``task`` are the session's (the process is
        set up once).
      validation_data: ``(x_val, y_val)``, ``(x_val, y_val, sample_weight_val)``, or a Dataset, PyDataset or
        generator of global batches, evaluated after each epoch (each ``validation_freq``-th).
      validation_split: a fraction in [0, 1): the last rows of numpy ``x``, ``y`` and ``sample_weight`` (taken
        before any shuffling) validate instead of training, as in Keras (``floor(rows * (1 - split))`` rows
        train); ignored when ``validation_data`` is given; refused with a dataset ``x``.
      validation_freq: evaluate after every N-th epoch (an int), or after the epochs (counted from 1) of a
        list, as in Keras.
      steps_per_epoch: steps per epoch, a positive int (default: the whole of numpy data, or a finite Dataset).
      validation_steps: eval steps, a positive int (default: all of ``validation_data``).
      shuffle: ``True`` or ``"batch"`` (within each batch): numpy rows in the order Keras' ``fit`` reads them
        under TensorFlow's global seed (every epoch the same, as its epochs read it), the same on every worker;
        a PyDataset's batches in Keras' order (Python's ``random`` at each epoch's start).
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
        shuffle's seed (default 0) where no global seed is set once ``model_fn`` has run (Keras' ``fit`` would
        draw another order each run), the same on every worker. Keras' precision policy is left as it is.
      cluster_resolver: an in-process cluster (``tfdist.deploy.in_process.in_process_cluster``), instead of TF_CONFIG.
      connect_timeout, progress_timeout: as ``--connect_timeout`` and ``--progress_timeout``.

    Returns:
      A ``keras.callbacks.History``: ``history`` holds each epoch's ``loss``, metrics and ``val_*`` (reduced
      over every replica and worker, as Keras defines them); ``model`` is the trained model. Every task
      returns the same figures; a serving task (ps, or a worker under ``parameter_server``) never returns.

    Raises:
      UserError: bad arguments (before the process is set up), a model without a loss, a metric or a loss
        reduction that does not add up, a model's own steps where they cannot run exactly, a cluster that
        does not fit the strategy, TensorFlow started before the set-up (``session.TOO_LATE``).
      PreemptedExit: a preemption (SIGTERM or SIGUSR1): the step reached is saved in ``model_dir`` after an
        ``error: Preempted at step N ...`` line; uncaught, the process ends with status 42, and the same call
        resumes there.
    """
    check_keras_backend()
    strategy, shuffle = strategy_name(strategy), keras_shuffle(shuffle)
    verbose = 0 if verbose is None else verbose  # silent, as Keras' fit reads a false value
    if isinstance(class_weight, dict) and not class_weight:
        class_weight = None  # Keras' fit weighs no class for an empty dict
    batch_size, epochs, initial_epoch, steps_per_epoch, validation_steps, seed, cpu_devices = map(
        python_int, (batch_size, epochs, initial_epoch, steps_per_epoch, validation_steps, seed, cpu_devices))
    source, validation = check_fit_args(
        model_fn, x, y, batch_size=batch_size, epochs=epochs, initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch, validation_data=validation_data, validation_steps=validation_steps,
        sample_weight=sample_weight, class_weight=class_weight, validation_split=validation_split,
        validation_freq=validation_freq)
    class_weight = keras_class_weight(class_weight)
    runtime = check_run_args(strategy=strategies.AUTO if strategy is None else strategy, cpu_devices=cpu_devices,
                             cluster=cluster, task=task, connect_timeout=connect_timeout,
                             progress_timeout=progress_timeout, seed=seed, model_dir=model_dir, shuffle=shuffle,
                             verbose=verbose, callbacks=callbacks, cluster_resolver=cluster_resolver)
    if model_dir is not None:
        RunDir(model_dir).check_fit_resume({"batch_size": batch_size})
    temporary = model_dir is None
    model_dir = tempfile.mkdtemp(prefix="tfdist-fit-") if temporary else str(model_dir)
    client = KerasClient(
        model_fn, source, validation, batch_size=batch_size, epochs=epochs, validation_freq=validation_freq,
        steps_per_epoch=steps_per_epoch, validation_steps=validation_steps, shuffle=shuffle,
        initial_epoch=initial_epoch, callbacks=callbacks, verbose=verbose, class_weight=class_weight, seed=seed,
        connect_timeout=runtime.connect_timeout, checkpoints=not temporary)
    try:
        # The run directory is written first by the client, once every argument is checked (fit.yaml).
        return driver.run(client, runtime, RunDir(model_dir), cluster_resolver=cluster_resolver,
                          verbose=bool(verbose))
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


@dataclasses.dataclass(eq=False)
class KerasClient(Client):
    """``tfdist.fit``'s run as a client of the driver (``engine.client.Client``): the model ``model_fn`` builds,
    trained on ``source`` and validated on ``validation`` (the ``fitting.inputs.Source``s that ``check_fit_args``
    decides from ``x``, ``y``, ``sample_weight``, ``validation_data`` and ``validation_split``) as Keras' ``fit``
    trains it. Every other field is ``fit``'s argument of the same name, checked; ``checkpoints``: the run
    directory is the user's (a temporary one keeps none).
    """

    model_fn: Callable
    source: Any
    validation: Any
    batch_size: int | None
    epochs: int
    validation_freq: int | list[int]
    steps_per_epoch: int | None
    validation_steps: int | None
    shuffle: bool | str
    initial_epoch: int
    callbacks: list | None
    verbose: int | str
    class_weight: dict | None
    seed: int | None
    connect_timeout: float
    checkpoints: bool = True

    where = "tfdist.fit"

    def check(self, placement, run_dir) -> None:
        if placement.role == "evaluate":
            from tfdist.fitting.evaluator import check_evaluator_args

            check_evaluator_args(placement, model_dir=run_dir.path if self.checkpoints else None,
                                 validation=self.validation)

    def prepare(self, strategy, placement) -> None:
        if placement.role == "evaluate":
            return self._prepare_evaluator(placement)
        import keras  # TensorFlow and Keras: once the process is set up

        from tfdist import one_device
        from tfdist.fitting.inputs import check_batch

        from tfdist.fitting.keras_data import read_by_keras

        one_device.install()  # Keras under the strategy computes one device's step, whatever Keras' trainer
        _patch_keras()
        if self.seed is not None:
            keras.utils.set_random_seed(self.seed)
        self.placement, self.replicas = placement, strategy.num_replicas_in_sync
        if self.batch_size is not None:
            check_batch(self.batch_size, self.replicas)
        # A PyDataset or a generator becomes the Dataset of the batches Keras' own data adapter makes of it.
        self.source = read_by_keras("x", self.source, shuffle=self.shuffle, class_weight=self.class_weight,
                                     steps_per_epoch=self.steps_per_epoch)
        self.validation = self._validation_batches()
        self.spec = self.source.spec()  # the type of its batches: the input is not read before training
        self.epoch_steps = self._epoch_steps()

    def build(self):
        from tfdist.fitting.keras_model import build_model

        placement = self.placement
        self.model, optimizer = build_model(self.model_fn, placement.strategy,
                                            placement.coordinator and placement.role == "train", self.spec)
        return self.model, optimizer

    def plan(self, state, strategy, placement, run_dir) -> Plan:
        from tfdist.fitting.keras_model import learning_rate
        from tfdist.fitting.start import start_of

        settings, steps = self._checked_steps(state, run_dir)
        eval_fn = self._eval_dataset_fn()
        self.start = start_of(state, strategy, placement, callbacks=self.callbacks or [],
                              epoch_steps=self.epoch_steps, initial_epoch=self.initial_epoch,
                              connect_timeout=self.connect_timeout)
        train_fn = self._train_dataset_fn(steps, strategy, placement, run_dir, settings)
        self.keras_callbacks = self._callbacks_hook(steps)
        optimizer = state.optimizer
        return Plan(steps=steps, train_dataset_fn=train_fn, eval_dataset_fn=eval_fn,
                    learning_rate=lambda _: learning_rate(optimizer), global_batch_size=self.batch_size or 0,
                    hooks=(self.keras_callbacks,))

    def schedule(self) -> Schedule:
        from tfdist.fitting.args import evaluates_after

        epoch_steps = self.epoch_steps
        return Schedule(total_steps=self.total_steps, steps_per_epoch=epoch_steps, steps_per_loop=self._per_execution,
                        log_every=epoch_steps, checkpoint_every=epoch_steps, grow=not self._batch_hooks,
                        evaluates_after=lambda epoch: evaluates_after(epoch, self.validation_freq))

    def banner(self, placement, replicas: int, schedule: Schedule) -> str:
        return (f"tfdist.fit: {placement.strategy} with {replicas} replicas, global batch {self.batch_size}, "
                f"{schedule.total_steps} steps ({schedule.steps_per_epoch} an epoch)")

    @contextlib.contextmanager
    def running(self, placement):
        import keras

        from tfdist.one_device.chief_files import chief_only_files

        epoch_steps = self.epoch_steps
        # The list gives the callbacks their model inside chief_only_files (TensorBoard fixes its paths then);
        # the History comes last, as in Keras' fit: it records what the callbacks add to the logs.
        with chief_only_files(self.callbacks or [], placement, restored=True):
            self.callback_list = self.keras_callbacks.callbacks = keras.callbacks.CallbackList(
                [*(self.callbacks or []), self.history], add_history=False, add_progbar=False, model=self.model,
                verbose=self.verbose, epochs=self.epochs, steps=epoch_steps)
            self.callback_list.on_train_begin()
            if self.start.step < self.total_steps:
                self.callback_list.on_epoch_begin(self.start.step // epoch_steps)
            yield

    def finish(self, state, result, placement, outputs):
        if self.epochs > 0:
            state.finalize_ema()  # the EMA weights into the model, as Keras' fit leaves them
        self.callback_list.on_train_end()
        if placement.coordinator:
            shutil.rmtree(outputs.run_dir.fit_inputs, ignore_errors=True)
        return self.history

    def evaluation(self, state, placement, run_dir):
        """A side-car evaluator's: ``validation_data`` on each checkpoint (``fitting.evaluator``)."""
        from tfdist.fitting.evaluator import validation_evaluation

        return validation_evaluation(state.model, self.validation, run_dir=run_dir, leader=placement.task.leader.name,
                                     final_step=self.epochs * self.epoch_steps if self.epoch_steps else None,
                                     batch_size=self.batch_size, validation_steps=self.validation_steps)

    def evaluated(self, evaluated):
        from tfdist.fitting.evaluator import validation_history

        return validation_history(evaluated, self.model, epoch_steps=self.epoch_steps, epochs=self.epochs,
                                  verbose=self.verbose)

    def _prepare_evaluator(self, placement) -> None:
        """An evaluator task's ``prepare``: it trains nothing, so its model is built from the validation batches'
        type, and the training input is only counted (its steps an epoch), never read."""
        self.placement, self.replicas = placement, 1
        self.validation = self._validation_batches()
        self.spec = self.validation.spec()
        self.epoch_steps = self._epoch_steps()

    def _epoch_steps(self) -> int | None:
        """Steps an epoch: ``steps_per_epoch``, else the training input's batches (None where not known: an input
        of unknown length without ``steps_per_epoch`` is refused before it trains)."""
        return self.steps_per_epoch or self.source.rows_and_steps(self.batch_size)[1]

    @property
    def total_steps(self) -> int:
        """The run's steps: ``epochs`` epochs."""
        return self.epochs * self.epoch_steps

    def _checked_steps(self, state, run_dir) -> tuple[dict, Any]:
        """``(the settings a resumed run must keep, the model's steps)``, once the run directory's record, the
        model's inputs and loss and the run's length are checked (nothing is written yet)."""
        from tfdist.config import check_total_steps
        from tfdist.fitting.keras_model import keras_steps, optimizer_settings
        from tfdist.one_device.batch_norm import warn_unsynchronized_batch_norm

        settings = {"batch_size": self.batch_size, **optimizer_settings(state.optimizer)}
        run_dir.check_fit_settings(settings)
        warn_unsynchronized_batch_norm(state.model, self.replicas)
        steps = keras_steps(state.model, state.optimizer, self.spec, source=self.source, validation=self.validation)
        check_total_steps(self.epochs, self.epoch_steps, epochs_name="epochs", steps_name="steps_per_epoch")
        return settings, steps

    def _eval_dataset_fn(self):
        """The eval pipeline of ``validation`` (None: nothing to evaluate)."""
        if self.validation is None:
            return None
        return self.validation.eval_dataset_fn(batch_size=self.batch_size, validation_steps=self.validation_steps,
                                               seed=self._seed)

    def _train_dataset_fn(self, steps, strategy, placement, run_dir, settings):
        """The train pipeline from the run's ``start``, and the run directory's first write (the chief's ``fit.yaml``
        of ``settings``) once the last check is done: a model's own ``train_step`` traced on its batches
        (``custom_steps.check_own_logs``). Under a coordinator the pipeline stages its input into the run directory,
        after it."""
        from tfdist.fitting.custom_steps import check_own_logs, overrides_steps

        start, coordinator = self.start, placement.coordinator
        train_fns = functools.partial(
            self.source.dataset_fns, class_weight=self.class_weight, batch_size=self.batch_size,
            shuffle=self.shuffle, seed=self._seed, training=True, start_step=start.skipped,
            own_order_per_worker=coordinator, stage_dir=run_dir.fit_inputs if coordinator else None,
            total_steps=self.total_steps - start.step + start.skipped, steps_per_epoch=self.steps_per_epoch)
        own_fn = train_fns()[0] if overrides_steps(self.model) else None  # never under a coordinator (refused)
        if own_fn is not None:
            check_own_logs(steps, strategy, own_fn)
        if placement.is_chief and self.checkpoints:
            run_dir.write_fit_record(settings)
        return own_fn or train_fns()[0]

    def _callbacks_hook(self, steps):
        """The hook that runs the callbacks and the ``History`` (their list is made in ``running``) on every task that
        runs the loop, with the same global logs, so that what they change (the learning rate, the weights,
        ``stop_training``) changes alike on every worker (their files are the chief's); a model's own metrics are
        reset as Keras' ``fit`` resets them."""
        import keras

        from tfdist.fitting.callbacks import KerasCallbacks
        from tfdist.fitting.custom_steps import overrides_steps

        own_steps = bool(overrides_steps(self.model))
        reset = steps.reset if own_steps else (lambda: None)
        reset()
        self.history = keras.callbacks.History()
        return KerasCallbacks(model=self.model, callbacks=None, reset=reset, epoch_steps=self.epoch_steps,
                              total_steps=self.total_steps, per_execution=self._per_execution, eval_reset=own_steps,
                              batch_hooks=self._batch_hooks)

    @property
    def _per_execution(self) -> int:
        """The model's ``steps_per_execution`` (1: none)."""
        return max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))

    @property
    def _batch_hooks(self) -> bool:
        """Whether a callback has train-batch hooks: then they run at each loop's end, and chunks do not grow."""
        from tfdist.fitting.callbacks import implements_batch_hooks

        return any(implements_batch_hooks(c) for c in self.callbacks or [])

    def _validation_batches(self):
        """The validation Source, a PyDataset or a generator read by Keras' own data adapter as its evaluate reads
        it (in order)."""
        if self.validation is None:
            return None
        from tfdist.fitting.keras_data import read_by_keras

        return read_by_keras("validation_data", self.validation, steps_per_epoch=self.validation_steps,
                              evaluation=True)

    @property
    def _seed(self) -> int:
        """The shuffle's seed where TensorFlow's global seed is not set (``seed``, else 0): the same on every
        worker."""
        return 0 if self.seed is None else self.seed


def _patch_keras() -> None:
    """Make Keras' own ``fit``, ``evaluate`` and ``predict`` work on the model ``fit`` returns (``keras_fit.install``).

    Its model lives under ``fit``'s strategy, where Keras' own trainer fails across workers without the patch.
    ``fit``'s own loop does not use Keras' trainer, so on a Keras whose trainer differs from the one the patch
    was made for, ``fit`` trains all the same and a warning says that Keras' calls are left as they are.
    """
    from absl import logging

    try:
        keras_fit.install(fit)
    except UserError as e:
        logging.warning("tfdist.fit trains, but leaves Keras' own fit, evaluate and predict on the model it returns "
                        "as this Keras has them: %s", e)
