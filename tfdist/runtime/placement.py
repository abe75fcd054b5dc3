"""Where this process stands, resolved once: its task in the cluster, the strategy's traits, its role.

Every part of a run asks the ``Placement`` instead of re-deriving it: one
local process is a placement with no task, so nothing below checks for None.
"""

from __future__ import annotations

import dataclasses

from tfdist import strategies
from tfdist.cluster.task import Task


@dataclasses.dataclass(frozen=True)
class Placement:
    """This process in its run.

    Attributes:
      strategy: the strategy's registered name.
      traits: its ``strategies.Traits``.
      task: this process's task in its cluster; None for one local process (or an in-process cluster, which
        this process coordinates).
    """

    strategy: str
    traits: strategies.Traits
    task: Task | None = None

    @property
    def name(self) -> str:
        """``"worker:1"``, or ``"local"`` outside a cluster."""
        return self.task.name if self.task else "local"

    @property
    def is_chief(self) -> bool:
        """Whether this task leads: it writes the outputs and runs the callbacks."""
        return self.task is None or self.task.is_leader

    @property
    def role(self) -> str:
        """``train``, ``serve`` or ``evaluate`` (``Traits.role``)."""
        return self.traits.role(self.task.type if self.task else None)

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
        return self.task.spec.num_tasks if self.task else 1

    def peers(self) -> list[Task]:
        """The other tasks of the training cluster (none outside a cluster)."""
        return self.task.peers() if self.task else []

    def training_tasks(self) -> list[str]:
        """The names of every task of the training cluster (``["local"]`` outside one): whose heartbeats to read."""
        if self.task is None:
            return ["local"]
        return [f"{t}:{i}" for t, i in self.task.training_spec.task_list()]


