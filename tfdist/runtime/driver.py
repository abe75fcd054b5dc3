"""The one assembly of a run, for every client (``engine.client.Client``): ``run``; and ``setup``, a process set up
for a user's own Keras script with no run (``tfdist.setup``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from tfdist import config as config_lib
from tfdist.engine.client import Client
from tfdist.engine.plan import Hook
from tfdist.rundir import RunDir
from tfdist.runtime import lifecycle, session


def run(client: Client, runtime, run_dir: RunDir, *, cluster_resolver=None, verbose: bool = True,
        hooks: Sequence[Hook] = ()) -> Any:
    """Run ``client`` on this task, from its place in the cluster to what ``client.finish`` returns.

    Place the task (or take over ``tfdist.setup``'s session), ``client.check`` before TensorFlow starts, then by
    role: an evaluator evaluates the chief's checkpoints through the client (``evaluate``); a serving task serves
    and never returns; a training task starts under preemption and among its peers (``lifecycle.training_task``),
    builds the state, makes the client's plan and schedule, opens the outputs (``params.yaml``), prints the chief's
    first line, runs the loop (``run_loop``) and ends with ``client.finish``.

    Args:
      client: the run's ``Client``.
      runtime: the run's ``RuntimeConfig``, checked (its strategy may still be ``"auto"``).
      run_dir: the run directory.
      cluster_resolver: an in-process cluster that this process coordinates, or None (--cluster, TF_CONFIG).
      verbose: print progress on the chief (and a serving task's lines).
      hooks: ``engine.plan.Hook``s of the caller, run between chunks of steps before the client's own.

    Raises:
      UserError: bad input (the cluster, the run directory, the client's own checks), or arguments that a
        ``tfdist.setup`` session fixed otherwise.
      RunFailed: the run started and could not go on (diverged, a lost peer, preempted).
    """
    taken = session.taken_over(runtime, client.where)
    if taken is not None:
        runtime, placement = taken.runtime, taken.placement
    else:
        runtime = config_lib.resolve_strategy(runtime, cluster_resolver)
        placement = session.place(runtime, in_process=cluster_resolver is not None)
    client.check(placement, run_dir)
    if placement.role == "evaluate":
        with lifecycle.evaluating_task(placement):
            return evaluate(client, placement, run_dir, connect_timeout=runtime.connect_timeout, verbose=verbose)
    with lifecycle.training_task(runtime, placement, run_dir, cluster_resolver=cluster_resolver,
                                 verbose=verbose) as training:
        from tfdist.engine.outputs import RunOutputs  # TensorFlow: once the task has started
        from tfdist.engine.state import build_state
        from tfdist.runtime.run_loop import run_loop

        strategy, is_chief = training.strategy, placement.is_chief
        client.prepare(strategy, placement)
        state = build_state(strategy, client.build, run_dir=run_dir, is_chief=is_chief, task=placement.name)
        plan = client.plan(state, strategy, placement, run_dir)
        plan = dataclasses.replace(plan, hooks=(*hooks, *plan.hooks))
        schedule = client.schedule()
        outputs = RunOutputs(run_dir=run_dir, is_chief=is_chief)
        if client.params is not None:
            outputs.write_params(client.params)
        if verbose and is_chief:
            print(f"{client.banner(placement, strategy.num_replicas_in_sync, schedule)}; {state.start()}", flush=True)
        with client.running(placement):
            result = run_loop(training, state, plan, schedule, outputs=outputs, checkpoints=client.checkpoints,
                              verbose=verbose and is_chief)
            return client.finish(state, result, placement, outputs)


def evaluate(client: Client, placement, run_dir: RunDir, *, connect_timeout: float, verbose: bool = True) -> Any:
    """An evaluator task's run, once it has started (one device, no strategy): through the client as training goes,
    ``client.prepare`` and ``client.build`` (outside any scope), then each checkpoint of the chief evaluated with
    the client's ``evaluation`` (``engine.evaluator.evaluate_continuously``); returns ``client.evaluated``.

    Args:
      client: the run's ``Client``.
      placement: this evaluator task's ``Placement``.
      run_dir: the run directory, whose checkpoints the chief writes.
      connect_timeout: seconds to wait for the chief to answer first.
      verbose: print a line per evaluated checkpoint.

    Raises:
      UserError: the chief never answered within ``connect_timeout``; the client's own checks.
      RunFailed: the chief stopped answering before its run's end.
    """
    import tensorflow as tf

    from tfdist.engine.evaluator import evaluate_continuously, evaluation_state

    client.prepare(tf.distribute.get_strategy(), placement)
    state = evaluation_state(client.build, run_dir)
    evaluated = evaluate_continuously(client.evaluation(state, placement, run_dir), state,
                                      leader=placement.task.leader, connect_timeout=connect_timeout, verbose=verbose)
    return client.evaluated(evaluated)


def setup(runtime, *, verbose: bool = True):
    """Set this process up for ``runtime`` once and return its strategy: ``tfdist.setup``'s start
    (``session.setup``), which a later run takes over.

    Raises:
      UserError: as ``session.setup``.
    """
    return session.setup(runtime, verbose=verbose)
