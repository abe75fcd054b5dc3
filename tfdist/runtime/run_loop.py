"""One run of the engine under a strategy, for every client: the strategy's loop (``make_loop``), the heartbeat
and watchdog, preemption as "stop at the next chunk", and the checkpoints and outputs closed however it ends.
"""

from __future__ import annotations

import dataclasses

from tfdist.engine.controller import Controller, Schedule
from tfdist.engine.loop import Loop
from tfdist.engine.plan import Plan
from tfdist.errors import PEER_LOST_EXIT_CODE
from tfdist.runtime.lifecycle import Training
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
      largest_chunk: the most steps one call of the loop ran (above ``steps_per_loop``: its chunks grew).
    """

    step: int
    last_train: dict | None
    final_eval: dict | None
    throughput: float
    first_step_at: float | None
    closures_per_worker: dict | None = None
    largest_chunk: int = 0


def run_loop(training: Training, state, plan: Plan, schedule: Schedule, *, outputs, checkpoints: bool = True,
             verbose: bool = False) -> RunResult:
    """Train ``plan`` from the state's step to the schedule's end; returns the ``RunResult``.

    Args:
      training: this task's ``Training`` (its placement, run directory, strategy, preemption, watchdog bound).
      state: the ``engine.state.TrainingState`` (its step counter and checkpoints).
      plan: the client's ``engine.plan.Plan``.
      schedule: the ``Schedule``.
      outputs: a ``RunOutputs``, closed at the end.
      checkpoints: save checkpoints on the schedule (False: none; the state's are closed at the end either way).
      verbose: print progress lines (the chief only).
    """
    placement, preemption = training.placement, training.preemption
    start_step = int(state.step.numpy())
    # From here on every task keeps a heartbeat in the run directory.
    batches = None if placement.coordinator else BatchCounter(start_step)
    train_dataset_fn = batches.wrap(plan.train_dataset_fn) if batches else plan.train_dataset_fn
    watchdog = Watchdog(
        task=placement.name, tasks=placement.training_tasks(), directory=training.run_dir.heartbeats,
        timeout=training.progress_timeout, step=start_step, total_steps=schedule.total_steps, batches=batches,
        before_exit=(lambda: tell_servers(placement, PEER_LOST_EXIT_CODE)) if placement.coordinator else None,
    )
    if placement.coordinator:
        # A coordinator's chunk is its closures, sized by steps_per_loop. Workers of a synchronous cluster grow
        # theirs alike: each chunk's size is agreed in its steps' all-reduce (engine.chunks).
        schedule = dataclasses.replace(schedule, grow=False)
    loop = make_loop(coordinator=placement.coordinator, strategy=training.strategy, steps=plan.steps,
                     step_counter=state.step, train_dataset_fn=train_dataset_fn, eval_dataset_fn=plan.eval_dataset_fn,
                     several_steps=schedule.grow or schedule.steps_per_loop > 1)
    controller = Controller(loop=loop, plan=plan, schedule=schedule,
                            checkpoints=state.checkpoints if checkpoints else None, outputs=outputs,
                            preemption=preemption, watchdog=watchdog, verbose=verbose)
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
                     closures_per_worker=getattr(loop, "closures_per_worker", None) if placement.coordinator else None,
                     largest_chunk=controller.largest_chunk)


def make_loop(*, coordinator: bool, strategy, steps, step_counter, train_dataset_fn, eval_dataset_fn,
              several_steps: bool = False) -> Loop:
    """The loop for a strategy: ``CoordinatorLoop`` when it has a coordinator, else ``SyncLoop``.

    Args:
        coordinator: the strategy's ``Traits.coordinator``.
        strategy, steps, step_counter: as both loops take them.
        train_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, repeated.
        eval_dataset_fn: ``InputContext -> Dataset`` of per-replica batches, finite (None: no eval);
            the coordinator reads it as one local pipeline.
        several_steps: whether the synchronous loop's chunks run several steps (``SyncLoop``).
    """
    if coordinator:
        import tensorflow as tf

        from tfdist.engine.coordinator_loop import CoordinatorLoop

        return CoordinatorLoop(strategy=strategy, steps=steps, step_counter=step_counter,
                               train_dataset_fn=train_dataset_fn,
                               eval_dataset=eval_dataset_fn(tf.distribute.InputContext()) if eval_dataset_fn else None)
    from tfdist.engine.sync_loop import SyncLoop

    return SyncLoop(strategy=strategy, steps=steps, step_counter=step_counter,
                    train_dataset_fn=train_dataset_fn, eval_dataset_fn=eval_dataset_fn, several_steps=several_steps)
