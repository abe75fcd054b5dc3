"""``tfdist.fit``'s side-car evaluator: an ``evaluator`` task of the cluster follows the chief's checkpoints and
evaluates ``validation_data`` on each with the model's compiled loss and metrics (``engine.evaluator``); its
client (``fitting.api.KerasClient``) gives the driver what is here.
"""

from __future__ import annotations

from tfdist.engine.plan import Hook, Plan
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


def validation_evaluation(model, validation, *, run_dir: RunDir, leader: str, final_step: int | None,
                          batch_size: int | None, validation_steps: int | None):
    """What ``tfdist.fit``'s evaluator task evaluates each checkpoint with, and when the run is over (an
    ``engine.evaluator.Evaluation``).

    Each checkpoint is evaluated on ``validation`` (a ``fitting.inputs.Source``) with the model's compiled loss and
    metrics (its ``test_step`` when it has its own, its metrics reset first), as Keras' ``evaluate`` on that
    checkpoint's weights; its figures are named as Keras' validation logs (``ValidationSteps``). The run is over
    once the chief keeps a checkpoint at ``final_step`` (None: not known), or, when the chief stops earlier (a
    callback's ``stop_training``), once the chief (``leader``) has stopped answering and ended its training well.

    Args:
      model: the evaluator's model, built as the chief builds it (``fitting.keras_model.build_model``).
      validation: the validation ``Source`` (read by Keras' data adapter where it reads it).
      run_dir: the chief's run directory.
      leader: the chief's task name (``chief:0``).
      final_step: the run's last step, as the chief counts it, or None.
      batch_size, validation_steps: ``tfdist.fit``'s, the same as the chief's.
    """
    from tfdist.engine.evaluator import Evaluation, RunEnd
    from tfdist.fitting.custom_steps import KerasModelSteps, overrides_steps
    from tfdist.fitting.steps import KerasSteps

    spec = validation.spec()
    own_steps = bool(overrides_steps(model))
    takes_tuples = isinstance(spec, tuple)
    steps = (KerasModelSteps(model=model, spec=spec, takes_tuples={"train_step": takes_tuples,
                                                                   "test_step": takes_tuples}) if own_steps
             else KerasSteps(model=model, optimizer=None, spec=spec))
    # An evaluator's plan: no train split, no learning rate.
    plan = Plan(steps=ValidationSteps(steps), train_dataset_fn=None, learning_rate=lambda step: float("nan"),
                eval_dataset_fn=validation.eval_dataset_fn(batch_size=batch_size, validation_steps=validation_steps,
                                                           seed=0),
                hooks=(ResetMetrics(steps),) if own_steps else ())
    return Evaluation(plan=plan, ends=RunEnd(final_step=final_step, ended_well=_ended_well(run_dir, leader)))


def _ended_well(run_dir: RunDir, leader: str):
    """Whether the leader, gone, ended its training well: a task that does removes its heartbeat file
    (``runtime.watchdog``), one that was stopped, preempted or killed leaves it."""
    from tfdist.runtime.watchdog import heartbeat_name

    return lambda: not (run_dir.heartbeats / heartbeat_name(leader)).exists()


def validation_history(evaluated, model, *, epoch_steps: int | None, epochs: int, verbose):
    """What ``tfdist.fit``'s evaluator task returns: a ``keras.callbacks.History`` of what it evaluated (an
    ``engine.evaluator.Evaluated``).

    ``history`` maps ``val_loss`` and each ``val_<metric>`` to a list with one value per checkpoint evaluated,
    oldest first; ``epoch`` holds those checkpoints' epochs (Keras' index, from 0; their steps where
    ``epoch_steps`` is not known); ``model`` holds the last one's weights. Checkpoints evaluated by an earlier
    evaluator of the run are not evaluated again, and not in it.
    """
    import keras

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
