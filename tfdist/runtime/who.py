"""Who this process is, asked once it has started: the session ``tfdist.setup`` made (``current``), and its
``Placement`` under a strategy (``placement_of``), for the clients that run inside a user's own script.
"""

from __future__ import annotations

from tfdist import strategies
from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.task import Task
from tfdist.runtime.placement import Placement

_current = None


def current():
    """The ``runtime.session.Session`` that ``tfdist.setup`` made in this process, or None."""
    return _current


def remember(session) -> None:
    """Keep ``session`` as this process's (``tfdist.setup``'s; one per process)."""
    global _current
    _current = session


def placement_of(strategy) -> Placement:
    """This process's ``Placement`` under ``strategy``, a ``MultiWorkerMirroredStrategy`` that Keras' own ``fit``
    runs under: the session's when ``tfdist.setup`` made ``strategy``, else the task of its cluster resolver
    (a strategy the script made itself, from TF_CONFIG or a resolver of its own).
    """
    session = current()
    if session is not None and session.strategy is strategy:
        return session.placement
    name = "multi_worker_mirrored"
    resolver = strategy.cluster_resolver
    jobs = resolver.cluster_spec().as_dict()
    if not jobs or resolver.task_type is None:
        return Placement(strategy=name, traits=strategies.traits(name))
    spec = ClusterSpec(tasks={job: list(addresses.values()) if isinstance(addresses, dict) else addresses
                              for job, addresses in jobs.items()}, source="cluster_resolver")
    task = Task(spec=spec, type=resolver.task_type, index=int(resolver.task_id))
    return Placement(strategy=name, traits=strategies.traits(name), task=task)
