"""The protocol a client of the one driver implements (``runtime.driver.run``), as Model Garden's task is for its
``run_experiment``: what the UNet experiment and ``tfdist.fit`` each add to a run that the driver assembles.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

from tfdist.engine.controller import Schedule
from tfdist.engine.plan import Plan


class Client:
    """One run of a client; the driver calls its methods once each, in this order.

    1. ``check(placement, run_dir)``, before TensorFlow starts; then, for an evaluator task, ``evaluate`` and
       nothing else.
    2. ``prepare(strategy, placement)`` once the task has started, ``build()`` under the strategy's scope (the
       driver adds the step counter and restores the latest checkpoint), ``plan(state, strategy, placement,
       run_dir)``, ``schedule()`` and ``banner(...)``.
    3. The driver runs the loop inside ``running(placement)``, and ends there with ``finish(...)``, whose value
       the run returns.

    One object serves one run, so a method may keep what a later one needs. The driver owns the rest: where the
    process stands, the run directory's place, the start under preemption and among the peers, the outputs,
    ``params`` written as ``params.yaml``, and the loop.

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

    def evaluate(self, placement, run_dir, *, verbose: bool) -> Any:
        """The run of an evaluator task (``placement.role == "evaluate"``), which neither starts a strategy nor
        trains; what the driver's ``run`` returns there. A client without an evaluator refuses the task here
        (``UserError``, one line)."""
        raise NotImplementedError

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
        """The run's ``Schedule`` (asked once the plan is made)."""
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
