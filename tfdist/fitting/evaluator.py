"""``tfdist.fit``'s side-car evaluator: an ``evaluator`` task of the cluster follows the chief's checkpoints and
evaluates ``validation_data`` on each with the model's compiled loss and metrics (``engine.evaluator``).
"""

from __future__ import annotations

from pathlib import Path

from tfdist.engine.plan import Hook
from tfdist.errors import UserError
from tfdist.rundir import RunDir
from tfdist.runtime.placement import Placement


def check_evaluator_args(placement: Placement, *, model_dir, validation) -> None:
    """Refuse an evaluator task that has nothing to follow or to evaluate (before TensorFlow starts).

    Raises:
      UserError: no ``model_dir`` (where the chief's checkpoints are), or no ``validation`` (neither
        ``validation_data`` nor a ``validation_split`` of numpy ``x``).
    """
    where = f"the evaluator task {placement.name} of tfdist.fit"
    if model_dir is None:
        raise UserError(f"Missing `model_dir` for {where}: it evaluates the checkpoints the chief saves there. "
                        "Received: model_dir=None. Expected the chief's model_dir, on storage both tasks share.")
    if validation is None:
        raise UserError(f"Missing `validation_data` for {where}: it has nothing to evaluate. Received: "
                        "validation_data=None and validation_split=0. Expected the validation_data (or "
                        "validation_split) that the chief is given, on every task.")


class ValidationSteps:
    """A Keras model's eval step whose figures are named as Keras' epoch logs name validation ones (``val_loss``,
    ``val_<metric>``), with the ``examples`` evaluated: the steps of an evaluator, which trains nothing.

    Args:
      steps: the model's ``KerasSteps`` (or ``KerasModelSteps`` for a model with its own ``test_step``).
    """

    count_key = "examples"

    def __init__(self, steps):
        self.steps = steps
        self.model = steps.model

    @property
    def stats_size(self) -> int:
        return self.steps.stats_size

    def evaluate(self, batch):
        """The model's test step on the batch; its stats vector."""
        return self.steps.evaluate(batch)

    def metrics(self, stats) -> dict:
        """``{"val_loss", "val_<metric>"..., "examples"}`` of a summed stats vector."""
        from tfdist.fitting.callbacks import keras_logs

        result = self.steps.metrics(stats)
        return {**keras_logs(None, result), "examples": result["examples"]}

    @staticmethod
    def describe(split: str, result: dict) -> str:
        from tfdist.fitting.steps import describe

        return describe(result)


class ResetMetrics(Hook):
    """Resets a model's own metrics before each eval pass, as Keras' ``evaluate`` does (``KerasModelSteps``)."""

    def __init__(self, steps):
        self.steps = steps

    def eval_begin(self) -> None:
        self.steps.reset()


def _left_well(run_dir: RunDir, leader: str):
    """Whether the leader, gone, ended its training well: a task that does removes its heartbeat file
    (``runtime.watchdog``), one that was stopped, preempted or killed leaves it."""
    from tfdist.runtime.watchdog import heartbeat_name

    return lambda: not (run_dir.heartbeats / heartbeat_name(leader)).exists()


def evaluate_fit(model_fn, source, validation, *, placement: Placement, model_dir: str | Path | None,
                 batch_size=None, epochs: int = 1, steps_per_epoch: int | None = None,
                 validation_steps: int | None = None, connect_timeout: float = 120.0, verbose: int = 1):
    """The evaluator task of ``tfdist.fit``: evaluate ``validation_data`` on each checkpoint of the chief.

    It builds ``model_fn()`` on this process's one device, with no strategy,
    and follows ``model_dir/checkpoints`` (``engine.evaluator.evaluate_continuously``):
    every checkpoint the chief keeps (one an epoch), oldest first, once, with the
    model's compiled loss and metrics (its ``test_step`` when it has its own), as
    Keras' ``evaluate`` on that checkpoint's weights. Each is a row of
    ``model_dir/evaluator.jsonl`` (``step``, ``split: "evaluator"``,
    ``val_loss``, ``val_<metric>``, ``examples``) and scalars in
    ``tensorboard/evaluator``; it writes nothing else. It returns once the
    checkpoint of the run's last step is evaluated (``epochs`` epochs of
    ``steps_per_epoch``, or of ``x``'s batches, as the chief counts them), or,
    when the chief stops earlier (a callback's ``stop_training``), once the chief
    has ended well and its last checkpoint is evaluated. The training ``source`` is only
    counted (its rows after ``validation_split``), never read.

    Args:
      model_fn, batch_size, epochs, steps_per_epoch, validation_steps, connect_timeout, verbose:
        ``tfdist.fit``'s, the same as the chief's.
      source, validation: the ``fitting.inputs.Source`` that the chief trains on and the one it validates on
        (None: nothing to evaluate, refused), as ``args.check_fit_args`` returns them.
      placement: this evaluator task's ``Placement``.
      model_dir: the chief's run directory (``check_evaluator_args`` refuses None before anything starts).

    Returns:
      A ``keras.callbacks.History``: ``history`` maps ``val_loss`` and each ``val_<metric>`` to a list with one
      value per checkpoint evaluated, oldest first; ``epoch`` holds those checkpoints' epochs (Keras' index,
      from 0); ``model`` holds the last one's weights. Checkpoints evaluated by an earlier evaluator of the
      run are not evaluated again, and not in it.

    Raises:
      UserError: the chief never answered within ``connect_timeout``.
      RunFailed: the chief stopped answering before it ended its training well.
      Preempted: a preemption signal, under the driver's evaluator start (there is nothing to save).
    """
    import keras

    from tfdist.engine.evaluator import evaluate_continuously, evaluation_state
    from tfdist.engine.plan import Task
    from tfdist.fitting.custom_steps import KerasModelSteps, overrides_steps
    from tfdist.fitting.steps import KerasSteps
    from tfdist.fitting.keras_model import build_model

    run_dir = RunDir(model_dir)
    epoch_steps = steps_per_epoch or source.rows_and_steps(batch_size)[1]
    spec = validation.spec()
    model, _ = build_model(model_fn, placement.strategy, False, spec)
    own_steps = bool(overrides_steps(model))
    takes_tuples = isinstance(spec, tuple)
    steps = (KerasModelSteps(model=model, spec=spec, takes_tuples={"train_step": takes_tuples,
                                                                   "test_step": takes_tuples}) if own_steps
             else KerasSteps(model=model, optimizer=None, spec=spec))
    # An evaluator's task: no train split, no learning rate.
    task = Task(steps=ValidationSteps(steps), train_dataset_fn=None, learning_rate=lambda step: float("nan"),
                eval_dataset_fn=validation.eval_dataset_fn(batch_size=batch_size, validation_steps=validation_steps,
                                                           seed=0),
                hooks=(ResetMetrics(steps),) if own_steps else ())
    state = evaluation_state(model, run_dir)
    leader = placement.task.leader
    evaluated = evaluate_continuously(task, state, leader=leader, connect_timeout=connect_timeout,
                                      final_step=epochs * epoch_steps if epoch_steps else None,
                                      left_well=_left_well(run_dir, leader.name), verbose=bool(verbose))
    history = keras.callbacks.History()
    history.set_model(model)
    history.set_params({"verbose": verbose, "epochs": epochs, "steps": epoch_steps})
    history.epoch = []
    for step, result in evaluated.results.items():
        history.epoch.append(step // epoch_steps - 1 if epoch_steps else step)
        for name, value in result.items():
            if name.startswith("val_"):
                history.history.setdefault(name, []).append(value)
    return history
