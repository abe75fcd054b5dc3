"""Continuous evaluation, as Orbit's ``evaluate_continuously``: an evaluator task follows the chief's checkpoints
and evaluates each one with a client's ``Evaluation`` (its ``Plan``, and ``RunEnd``: when the run is over), through
the engine's own eval pass, into files of its own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Iterable

from tfdist.cluster.peers import POLL_SECONDS, PeerWatch
from tfdist.cluster.task import Task
from tfdist.engine.checkpoints import Checkpoints
from tfdist.engine.controller import Controller
from tfdist.engine.outputs import RunOutputs
from tfdist.engine.state import TrainingState
from tfdist.engine.plan import Plan
from tfdist.errors import RunFailed
from tfdist.rundir import RunDir

#: The evaluator's split: its rows in ``evaluator.jsonl`` and its TensorBoard directory.
SPLIT = "evaluator"


def evaluation_state(build: Callable[[], tuple[Any, Any]], run_dir: RunDir) -> TrainingState:
    """The model of ``build() -> (model, optimizer or None)`` (a client's ``build``, called outside any strategy;
    the optimizer is left out: an evaluator trains nothing) and a step counter, into which the chief's checkpoints
    of ``run_dir`` are restored one at a time (``Checkpoints.for_evaluation``); nothing is restored yet."""
    import tensorflow as tf

    model, _ = build()
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    return TrainingState(model=model, optimizer=None, step=step, restored=None,
                         checkpoints=Checkpoints.for_evaluation(model=model, step=step, run_dir=run_dir))


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """What one evaluator evaluated.

    Attributes:
      results: each evaluated checkpoint's step -> its metrics (the plan's steps' ``metrics``), oldest first.
    """

    results: dict[int, dict]

    @property
    def steps(self) -> list[int]:
        """The steps evaluated, oldest first."""
        return list(self.results)

    @property
    def last(self) -> dict | None:
        """The metrics of the newest checkpoint evaluated, or None."""
        return self.results[self.steps[-1]] if self.results else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunEnd:
    """When the run that an evaluator follows is over: the one predicate ``evaluate_continuously`` ends on, built
    of the signals a client has (any of them ends the run).

    Attributes:
      final_step: the run's last step, where the client knows it: a checkpoint the chief keeps there or later is
        the run's last.
      finished: whether the chief says its run is over (e.g. it wrote its summary); asked before each look at the
        checkpoints, since the chief lists its last checkpoint before it says so.
      ended_well: asked once the leader stopped answering: whether it ended its training well.
    """

    final_step: int | None = None
    finished: Callable[[], bool] | None = None
    ended_well: Callable[[], bool] | None = None

    def __call__(self, kept: Iterable[int], leader_gone: bool) -> bool:
        """Whether the run is over, from the steps of the checkpoints the chief keeps (``kept``) and whether the
        leader stopped answering (``leader_gone``)."""
        return ((self.final_step is not None and any(step >= self.final_step for step in kept))
                or (self.finished is not None and self.finished())
                or (leader_gone and self.ended_well is not None and self.ended_well()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What a client gives its evaluator task (``Client.evaluation``), as its ``Plan`` is what it gives training.

    Attributes:
      plan: the ``Plan`` each checkpoint is evaluated with: its ``steps`` (and their ``metrics``) and
        ``eval_dataset_fn`` (per-replica batches of one replica: the whole eval split); its hooks run around each
        eval pass. It trains nothing (no ``train_dataset_fn``).
      ends: when the run is over (``RunEnd``).
    """

    plan: Plan
    ends: RunEnd


def evaluate_continuously(evaluation: Evaluation, state: TrainingState, *, leader: Task,
                          connect_timeout: float, verbose: bool = True) -> Evaluated:
    """Evaluate each checkpoint of the chief's ``model_dir/checkpoints`` with ``evaluation``'s plan, oldest first.

    Every checkpoint the chief keeps (``CheckpointManager``'s list, not only
    the latest) is restored into ``state`` (``Checkpoints.restore_for_evaluation``)
    and evaluated once with the plan's eval steps over its ``eval_dataset_fn``
    (the controller's eval pass, on this process's one device); steps that
    ``evaluator.jsonl`` already has (an earlier evaluator of the run) are
    skipped. A checkpoint that the chief rotated away before the evaluator read
    it is skipped too: the evaluator cannot keep it. Rows go to
    ``evaluator.jsonl`` (``split: "evaluator"``) and scalars to
    ``tensorboard/evaluator``, never into the chief's files.

    It ends once ``evaluation.ends`` says the run is over (asked before each
    look at the list, with whether the leader was gone before it) and every
    checkpoint listed then is evaluated. Until then the leader must answer
    (within ``connect_timeout`` at the start, unless the run is over already),
    and keep answering.

    Args:
      evaluation: the client's ``Evaluation`` (its plan, and when the run is over).
      state: the ``TrainingState`` the checkpoints are restored into (``evaluation_state``).
      leader: the chief's task (its address: the evaluator follows it).
      connect_timeout: seconds to wait for the leader to answer first.
      verbose: print a line per evaluated checkpoint.

    Raises:
      UserError: the leader never answered within ``connect_timeout`` (where the run's end is not there yet).
      RunFailed: the leader stopped answering before the run's end.
    """
    import tensorflow as tf

    from tfdist.engine.sync_loop import SyncLoop

    plan, over, checkpoints = evaluation.plan, evaluation.ends, state.checkpoints
    run_dir = checkpoints.run_dir
    watch = PeerWatch.of(leader)
    kept = checkpoints.kept()
    if not over([step for step, _ in kept], leader_gone=False):  # a run over already is evaluated without its chief
        watch.wait_up(connect_timeout, why="the evaluator follows its checkpoints")
    loop = SyncLoop(strategy=tf.distribute.get_strategy(), steps=plan.steps, step_counter=state.step,
                    train_dataset_fn=None, eval_dataset_fn=plan.eval_dataset_fn)
    outputs = RunOutputs(run_dir=run_dir, is_chief=True, evaluator=True)
    controller = Controller(loop=loop, plan=plan, schedule=None, checkpoints=None, outputs=outputs, verbose=verbose)
    done = _steps_in(run_dir.evaluator_metrics)
    results: dict[int, dict] = {}
    try:
        while True:
            gone = watch.gone()  # first: a leader gone has listed every checkpoint it will, and said how it ended
            ended = over([step for step, _ in kept], leader_gone=gone)  # before the list it judges
            kept = checkpoints.kept()
            waiting = [(step, path) for step, path in kept if step not in done]
            if waiting:
                step, path = waiting[0]
                if not checkpoints.restore_for_evaluation(path):
                    time.sleep(POLL_SECONDS)  # rotated away meanwhile (then no longer listed): read the list again
                    continue
                results[step] = controller.evaluate(step, split=SPLIT)
                done.add(step)
                continue
            if ended:
                break
            if gone:
                raise RunFailed(
                    f"The leader {watch.name} at {watch.address} stopped answering before the end of its run. "
                    f"Received: checkpoints evaluated at steps {list(results) or 'none'}. "
                    "Expected the run to finish; relaunch it to resume from its latest checkpoint."
                )
            time.sleep(POLL_SECONDS)
    finally:
        outputs.close()
    return Evaluated(results=results)


def _steps_in(rows) -> set[int]:
    """The steps of the rows of ``evaluator.jsonl`` (none if it does not exist; a torn last line is ignored)."""
    steps = set()
    if rows.exists():
        for line in rows.read_text().splitlines():
            try:
                steps.add(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                pass
    return steps
