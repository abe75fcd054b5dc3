"""Where this process stands, resolved once: its task in the cluster, the strategy's traits, its role."""

from __future__ import annotations

import dataclasses

from tfdist import strategies
from tfdist.cluster.task import Task
from tfdist.errors import UserError


@dataclasses.dataclass(frozen=True)
class Placement:
    """This process in its run.

    Attributes:
      strategy: the strategy's registered name.
      traits: its ``strategies.Traits``.
      task: this process's task in its cluster; ``Task.local()`` for one process alone (or one that
        coordinates an in-process cluster).
    """

    strategy: str
    traits: strategies.Traits
    task: Task = dataclasses.field(default_factory=Task.local)

    @property
    def name(self) -> str:
        """``"worker:1"``, or ``"local"`` outside a cluster."""
        return self.task.name

    @property
    def is_chief(self) -> bool:
        """Whether this task leads: it writes the outputs and runs the callbacks."""
        return self.task.is_leader

    @property
    def role(self) -> str:
        """``train``, ``serve`` or ``evaluate`` (``Traits.role``)."""
        return self.traits.role(self.task)

    @property
    def coordinator(self) -> bool:
        """Whether a coordinator drives the workers (``parameter_server``)."""
        return self.traits.coordinator

    @property
    def num_workers(self) -> int:
        """Training workers of the cluster (1 outside a cluster)."""
        return self.traits.num_workers(self.task)

    @property
    def num_tasks(self) -> int:
        """Tasks of the cluster, this one included (1 outside a cluster)."""
        return self.task.spec.num_tasks

    def peers(self) -> list[Task]:
        """The other tasks of the training cluster (none outside a cluster)."""
        return self.task.peers()

    def training_tasks(self) -> list[str]:
        """The names of every task of the training cluster (``["local"]`` outside one): whose heartbeats to read."""
        return [task.name for task in self.task.training_tasks()]

    def refuse_evaluator(self, where: str, instead: str) -> None:
        """Refuse an evaluator task where nothing evaluates (``where``: ``tfdist.setup``, ``tfdist.fit``);
        ``instead`` says what evaluates there.

        Raises:
          UserError: this is an evaluator task.
        """
        if self.role == "evaluate":
            raise UserError(f"Invalid task for {where}: {self.name}. Received: an evaluator task. Expected a chief, "
                            f"worker or ps task ({instead}).")
