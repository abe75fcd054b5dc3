"""One run of the engine under a strategy, for every client: the heartbeat and watchdog, preemption as "stop
at the next chunk", and the checkpoints and outputs closed however the run ends.
"""

from __future__ import annotations

import dataclasses

from tfdist.engine.controller import Controller, Hooks, Schedule
from tfdist.engine.loop import make_loop
from tfdist.errors import PEER_LOST_EXIT_CODE
from tfdist.rundir import RunDir
from tfdist.runtime.placement import Placement
from tfdist.runtime.serving import tell_servers
from tfdist.runtime.watchdog import BatchCounter, Watchdog


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a run of the loop ended on this task.

    Attributes:
      step: the step reached.
      last_train: the metrics of the last train log row (None: no row).
      final_eval: the last eval's metrics (None: no eval).
      throughput: examples (images) per second of training after the first chunk (NaN: too short to tell).
      first_step_at: unix time the first chunk of steps ended.
      closures_per_worker: under a coordinator, the closures whose result each worker returned; else None.
    """

    step: int
    last_train: dict | None
    final_eval: dict | None
    throughput: float
    first_step_at: float | None
    closures_per_worker: dict | None = None


def run_loop(*, placement: Placement, run_dir: RunDir, strategy, steps, state, outputs, schedule: Schedule,
             train_dataset_fn, eval_dataset_fn, progress_timeout: float, preemption=None, checkpoints=True,
             global_batch_size: int = 0, learning_rate, preview=None, verbose: bool = False,
             hooks: Hooks = Hooks()) -> RunResult:
    """Train ``steps`` from the state's step to the schedule's end; returns the ``RunResult``.

    Args:
      placement: this task.
      run_dir: the run directory (heartbeats).
      strategy, steps: as the loops take them.
      state: the ``engine.state.TrainingState`` (its step counter and checkpoints).
      outputs: a ``RunOutputs``, closed at the end.
      schedule: the ``Schedule``.
      train_dataset_fn, eval_dataset_fn: ``InputContext -> Dataset`` (``eval_dataset_fn`` None: no eval).
      progress_timeout: ``--progress_timeout``, the watchdog's bound.
      preemption: this task's ``Preemption``, or None.
      checkpoints: save checkpoints on the schedule (False: none; the state's are closed at the end either way).
      global_batch_size, learning_rate, preview, verbose, hooks: as ``Controller`` takes them.
    """
    start_step = int(state.step.numpy())
    # From here on every task keeps a heartbeat in the run directory.
    batches = None if placement.coordinator else BatchCounter(start_step)
    watchdog = Watchdog(
        task=placement.name, tasks=placement.training_tasks(), directory=run_dir.heartbeats,
        timeout=progress_timeout, step=start_step, total_steps=schedule.total_steps, batches=batches,
        before_exit=(lambda: tell_servers(placement, PEER_LOST_EXIT_CODE)) if placement.coordinator else None,
    )
    loop = make_loop(coordinator=placement.coordinator, strategy=strategy, steps=steps, step_counter=state.step,
                     train_dataset_fn=batches.wrap(train_dataset_fn) if batches else train_dataset_fn,
                     eval_dataset_fn=eval_dataset_fn)
    controller = Controller(loop=loop, schedule=schedule, checkpoints=state.checkpoints if checkpoints else None,
                            outputs=outputs, global_batch_size=global_batch_size, learning_rate=learning_rate,
                            preview=preview, verbose=verbose, preemption=preemption, watchdog=watchdog,
                            evaluates=eval_dataset_fn is not None, hooks=hooks)
    if preemption is not None:
        preemption.deferred()  # from here a signal stops the run at the next chunk, with a checkpoint
    try:
        with watchdog:
            final = controller.run(start_step)
    finally:
        state.checkpoints.close()
        outputs.close()
    return RunResult(step=int(state.step.numpy()), last_train=controller.last_train, final_eval=final,
                     throughput=controller.throughput, first_step_at=controller.first_step_at,
                     closures_per_worker=getattr(loop, "closures_per_worker", None) if placement.coordinator else None)
