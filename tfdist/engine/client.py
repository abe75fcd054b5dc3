"""The protocol a client of the one driver implements (``runtime.driver.run``), as Model Garden's task is for its
``run_experiment``: what the UNet experiment and ``tfdist.fit`` each add to a run that the driver assembles.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager

from tfdist.engine.controller import Schedule
from tfdist.engine.plan import Plan

if TYPE_CHECKING:  # TensorFlow: the evaluator's module imports it
    from tfdist.engine.evaluator import Evaluated, Evaluation


class Client:
    """One run of a client; the driver calls its methods once each, in this order.

    1. ``check(placement, run_dir)``, before TensorFlow starts.
    2. ``prepare(strategy, placement)`` once the task has started, and ``build()`` under the strategy's scope (the
       driver adds the step counter and restores the latest checkpoint). An evaluator task gets the default
       strategy (one device) and builds outside any scope.
    3. A training task: ``plan(state, strategy, placement, run_dir)``, ``schedule()`` and ``banner(...)``; the
       driver runs the loop inside ``running(placement)``, and ends there with ``finish(...)``, whose value the
       run returns.
    4. An evaluator task: ``evaluation(state, placement, run_dir)``, evaluated on each checkpoint of the chief
       (``engine.evaluator.evaluate_continuously``), then ``evaluated(evaluated)``, whose value the run returns.

    One object serves one run, so a method may keep what a later one needs, and each needs only what the methods
    before it in this order made. The driver owns the rest: where the process stands, the run directory's place,
    the start under preemption and among the peers, the outputs, ``params`` written as ``params.yaml``, and the
    loop.

    Attributes:
      where: the client in messages (``tfdist.train``, ``tfdist.fit``).
      params: the run's resolved config, which the chief writes as ``params.yaml`` (None: the client keeps its
        own record of the run, such as ``fit.yaml``).
      checkpoints: whether the loop saves checkpoints on the schedule (the latest is restored either way).
    """

    where: str = "tfdist"
    params: Any = None
    checkpoints: bool = True

    def check(self, placement, run_dir) -> None:
        """Refuse what cannot run here (``UserError``), before TensorFlow starts and before anything is written.

        Args:
          placement: this process's ``runtime.placement.Placement``.
          run_dir: the run's ``rundir.RunDir``.
        """

    def prepare(self, strategy, placement) -> None:
        """Set Keras up and check what depends on the strategy (its replicas), before the state is built."""

    def build(self) -> tuple[Any, Any]:
        """``(model, optimizer or None)``, called under the strategy's scope."""
        raise NotImplementedError

    def plan(self, state, strategy, placement, run_dir) -> Plan:
        """The engine's ``Plan`` that trains ``state`` (an ``engine.state.TrainingState``, restored).

        The last place to refuse a run before anything is written into the run directory; it may move the
        state's step (an initial epoch of a fresh run).
        """
        raise NotImplementedError

    def schedule(self) -> Schedule:
        """The run's ``Schedule`` (asked once the state is built)."""
        raise NotImplementedError

    def banner(self, placement, replicas: int, schedule: Schedule) -> str:
        """The chief's first line of the run (the driver adds where the state starts)."""
        raise NotImplementedError

    def running(self, placement) -> ContextManager:
        """A context held around the loop and ``finish`` (nothing here)."""
        return contextlib.nullcontext()

    def finish(self, state, result, placement, outputs) -> Any:
        """What the run returns, from the state and the loop's ``runtime.run_loop.RunResult``; the chief's last
        writes through ``outputs`` (an ``engine.outputs.RunOutputs``)."""
        raise NotImplementedError

    def evaluation(self, state, placement, run_dir) -> Evaluation:
        """What an evaluator task (``placement.role == "evaluate"``) evaluates each checkpoint of the chief with,
        and when the run is over (an ``engine.evaluator.Evaluation``); ``state`` holds the model, into which each
        checkpoint is restored. A client without an evaluator refuses the task in ``check``."""
        raise NotImplementedError

    def evaluated(self, evaluated: Evaluated) -> Any:
        """What an evaluator task's run returns, from what it evaluated (an ``engine.evaluator.Evaluated``)."""
        raise NotImplementedError
