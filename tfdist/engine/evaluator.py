"""Continuous evaluation, as Orbit's ``evaluate_continuously``: an evaluator task follows the chief's checkpoints
and evaluates each one with any client's engine ``Task``, through the engine's own eval pass, into files of its own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable

from tfdist.cluster.peers import POLL_SECONDS, PeerWatch
from tfdist.cluster.task import Task as ClusterTask
from tfdist.engine.checkpoints import Checkpoints
from tfdist.engine.controller import Controller
from tfdist.engine.outputs import RunOutputs
from tfdist.engine.state import TrainingState
from tfdist.engine.plan import Plan
from tfdist.errors import RunFailed
from tfdist.rundir import RunDir

#: The evaluator's split: its rows in ``evaluator.jsonl`` and its TensorBoard directory.
SPLIT = "evaluator"


def evaluation_state(model, run_dir: RunDir) -> TrainingState:
    """``model`` (built outside any strategy) and a step counter, into which the chief's checkpoints of
    ``run_dir`` are restored one at a time (``Checkpoints.for_evaluation``); nothing is restored yet."""
    import tensorflow as tf

    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    return TrainingState(model=model, optimizer=None, step=step, restored=None,
                         checkpoints=Checkpoints.for_evaluation(model=model, step=step, run_dir=run_dir))


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """What one evaluator evaluated.

    Attributes:
      results: each evaluated checkpoint's step -> its metrics (the task's steps' ``metrics``), oldest first.
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


def _never() -> bool:
    return False


def evaluate_continuously(plan: Plan, state: TrainingState, *, leader: ClusterTask, connect_timeout: float,
                          final_step: int | None = None, finished: Callable[[], bool] = _never,
                          left_well: Callable[[], bool] = _never, verbose: bool = True) -> Evaluated:
    """Evaluate each checkpoint of the chief's ``model_dir/checkpoints`` with ``task``, oldest first.

    Every checkpoint the chief keeps (``CheckpointManager``'s list, not only
    the latest) is restored into ``state`` (``Checkpoints.restore_for_evaluation``)
    and evaluated once with the task's eval steps over its ``eval_dataset_fn``
    (the controller's eval pass, on this process's one device); steps that
    ``evaluator.jsonl`` already has (an earlier evaluator of the run) are
    skipped. A checkpoint that the chief rotated away before the evaluator read
    it is skipped too: the evaluator cannot keep it. Rows go to
    ``evaluator.jsonl`` (``split: "evaluator"``) and scalars to
    ``tensorboard/evaluator``, never into the chief's files.

    It ends once the run's last checkpoint is evaluated: one at ``final_step``
    or later; or none left once ``finished()`` says the run is over (asked
    before each look at the list, since the chief lists its last checkpoint
    before it says so); or none left once the leader stopped answering and
    ``left_well()`` says it ended its training well. Until then the leader
    must answer (within ``connect_timeout`` at the start), and keep answering.

    Args:
      task: the client's engine ``Task``: its ``steps`` (and their ``metrics``) and ``eval_dataset_fn``
        (per-replica batches of one replica: the whole eval split); its hooks run around each eval pass.
      state: the ``TrainingState`` the checkpoints are restored into (``evaluation_state``).
      leader: the chief's task (its address: the evaluator follows it).
      connect_timeout: seconds to wait for the leader to answer first.
      final_step: the run's last step, where the client knows it (None: it does not).
      finished: whether the chief says its run is over (e.g. it wrote its summary).
      left_well: asked once the leader stopped answering: whether it ended its training well (else the run failed).
      verbose: print a line per evaluated checkpoint.

    Raises:
      UserError: the leader never answered within ``connect_timeout`` (where the run's end is not there yet).
      RunFailed: the leader stopped answering before the run's end.
    """
    import tensorflow as tf

    from tfdist.engine.sync_loop import SyncLoop

    checkpoints = state.checkpoints
    run_dir = checkpoints.run_dir
    watch = PeerWatch.of(leader)
    ended = final_step is not None and any(step >= final_step for step, _ in checkpoints.kept())
    if not (ended or finished()):  # a run that is over already is evaluated without its chief
        watch.wait_up(connect_timeout, why="the evaluator follows its checkpoints")
    loop = SyncLoop(strategy=tf.distribute.get_strategy(), steps=plan.steps, step_counter=state.step,
                    train_dataset_fn=None, eval_dataset_fn=plan.eval_dataset_fn)
    outputs = RunOutputs(run_dir=run_dir, is_chief=True, evaluator=True)
    controller = Controller(loop=loop, plan=plan, schedule=None, checkpoints=None, outputs=outputs, verbose=verbose)
    done = _steps_in(run_dir.evaluator_metrics)
    results: dict[int, dict] = {}
    gone_well = False
    try:
        while True:
            over = gone_well or finished()  # before the list: the final checkpoint is listed before the end is told
            waiting = [(step, path) for step, path in checkpoints.kept() if step not in done]
            if waiting:
                step, path = waiting[0]
                if not checkpoints.restore_for_evaluation(path):
                    time.sleep(POLL_SECONDS)  # rotated away meanwhile (then no longer listed): read the list again
                    continue
                results[step] = controller.evaluate(step, split=SPLIT)
                done.add(step)
                continue
            if over or (final_step is not None and max(done, default=-1) >= final_step):
                break
            if watch.gone():
                if not left_well():
                    raise RunFailed(
                        f"The leader {watch.name} at {watch.address} stopped answering before the end of its run. "
                        f"Received: checkpoints evaluated at steps {list(results) or 'none'}. "
                        "Expected the run to finish; relaunch it to resume from its latest checkpoint."
                    )
                gone_well = True  # one more look: its last checkpoint may be listed since the last one
                continue
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
