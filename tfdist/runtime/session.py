"""A task's one start (``start``): placed, checked, then serving or set up with its strategy, once per process.

``tfdist.setup``, ``tfdist.fit`` and ``tfdist.train`` all start here, before any other TensorFlow op, since
TensorFlow fixes a process's devices and collectives when it starts; ``current`` is the session made.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tfdist import config as config_lib
from tfdist import strategies
from tfdist.cluster import network, peers, sources
from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.task import Task
from tfdist.errors import UserError
from tfdist.runtime.placement import Placement
from tfdist.runtime.serving import serve

#: What a too-late set-up says to do (TensorFlow started before the strategy could set up the process).
TOO_LATE = ("Expected tfdist.setup(...) (or tfdist.fit) before any other TensorFlow op: call it at the top of the "
            "script, before building datasets, tensors or models (or restart the process or notebook kernel).")


@dataclasses.dataclass(frozen=True)
class Session:
    """This process's set-up, made once by ``setup``.

    Attributes:
        runtime: the ``RuntimeConfig`` it was made with (strategy name, devices, cluster, timeouts).
        placement: this process's ``Placement``.
        strategy: the ``tf.distribute.Strategy``.
    """

    runtime: Any
    placement: Placement
    strategy: Any


_current: Session | None = None


def current() -> Session | None:
    """The session ``setup`` made in this process, or None."""
    return _current


def placement_of(strategy) -> Placement:
    """This process's ``Placement`` under ``strategy``, a ``MultiWorkerMirroredStrategy`` that Keras' own ``fit``
    runs under: the session's when ``tfdist.setup`` made ``strategy``, else the task of its cluster resolver
    (a strategy the script made itself, from TF_CONFIG or a resolver of its own).
    """
    if _current is not None and _current.strategy is strategy:
        return _current.placement
    name = "multi_worker_mirrored"
    resolver = strategy.cluster_resolver
    jobs = resolver.cluster_spec().as_dict()
    if not jobs or resolver.task_type is None:
        return Placement(strategy=name, traits=strategies.traits(name))
    spec = ClusterSpec(tasks={job: list(addresses.values()) if isinstance(addresses, dict) else addresses
                              for job, addresses in jobs.items()}, source="cluster_resolver")
    task = Task(spec=spec, type=resolver.task_type, index=int(resolver.task_id))
    return Placement(strategy=name, traits=strategies.traits(name), task=task)


def place(runtime, *, in_process: bool = False) -> Placement:
    """This process's ``Placement``: its task (``--cluster/--task``, TF_CONFIG or Slurm), checked against the
    strategy; ``Task.local()`` when there is no cluster.

    The answer is also written to ``os.environ["TF_CONFIG"]`` (the training cluster, for a training or
    serving task): TensorFlow's ``TFConfigClusterResolver``, which ``MultiWorkerMirroredStrategy`` and
    ``ParameterServerStrategy`` make when given no resolver, and Keras' multi-worker code read it there.

    ``runtime``: the run's ``RuntimeConfig``. ``in_process``: the cluster is made and coordinated by this
    process, whose task is ``Task.local()``.
    """
    rt = runtime
    traits = strategies.traits(rt.strategy)
    if in_process:
        return Placement(strategy=rt.strategy, traits=traits)
    task = sources.resolve_task(rt.cluster or None, rt.task or None, slurm_tasks=rt.slurm_tasks)
    if task is None:
        if traits.coordinator:
            raise UserError(
                f"Missing cluster for strategy={rt.strategy}. Received: no --cluster and no TF_CONFIG. "
                "Expected --cluster FILE --task TYPE:I with a chief, workers and ps."
            )
        return Placement(strategy=rt.strategy, traits=traits)
    traits.check_cluster(task.spec)
    if traits.role(task) != "evaluate":
        # TensorFlow's resolvers read TF_CONFIG; the evaluator is not part of the cluster that trains.
        os.environ["TF_CONFIG"] = task.tf_config_json(training=True)
    public = network.public_addresses(task.spec)
    if public:
        from absl import logging

        logging.warning(
            "The cluster spec %s has addresses that may be reachable from outside: %s. TensorFlow's gRPC "
            "server has no authentication and runs what it receives: use an isolated network.",
            task.spec.source, ", ".join(public),
        )
    return Placement(strategy=rt.strategy, traits=traits, task=task)


#: Why an evaluator task cannot start where it is asked to (``start``'s ``where``).
EVALUATOR_ELSEWHERE = {"tfdist.setup": "an evaluator calls tfdist.fit without tfdist.setup, or runs "
                                       "`python -m tfdist.train`"}


def refuse_evaluator(placement: Placement, where: str) -> None:
    """Refuse an evaluator task for ``where`` (``tfdist.setup``): it trains nothing there.

    Raises:
      UserError: ``placement`` is an evaluator's.
    """
    if placement.role == "evaluate":
        raise UserError(f"Invalid task for {where}: {placement.name}. Received: an evaluator task. Expected a "
                        f"chief, worker or ps task ({EVALUATOR_ELSEWHERE.get(where, 'it does not train')}).")


def start(runtime, placement: Placement | None = None, *, where: str, cluster_resolver=None, heartbeats=None,
          verbose: bool = True, keras_setup: bool = True, seed: int = 0, deterministic: bool = False) -> Session:
    """Start this task, the one way every client does: place it, refuse an evaluator, check its port, then
    serve (a ps task, or a worker under a coordinator: never returns) or set up TensorFlow and the strategy.

    Args:
      runtime: the run's ``RuntimeConfig`` (strategy, devices, cluster, timeouts).
      placement: this process's ``Placement`` when the caller placed it already (to check its run first).
      where: the client, for messages (``tfdist.setup``, ``tfdist.fit``, ``tfdist.train``).
      cluster_resolver: an in-process cluster this process coordinates, or None.
      heartbeats: where a serving task writes its heartbeats (a run directory's), or None.
      verbose: a serving task prints what it does.
      keras_setup: set Keras' precision (``runtime``'s), ``seed`` and ``deterministic``
        (``strategies.setup_keras``).
      seed, deterministic: the run's seed and op determinism, for ``keras_setup``.

    Returns:
      The ``Session``; ``setup`` keeps it as the process's (``current``), a run of ``fit`` or ``train`` does not
      (one process may run several, as TensorFlow allows).

    Raises:
      UserError: an evaluator task, a taken port, a cluster that does not fit, or TensorFlow started in a way
        the strategy cannot use.
    """
    if placement is None:
        placement = place(runtime, in_process=cluster_resolver is not None)
    refuse_evaluator(placement, where)
    rt, traits, task = runtime, placement.traits, placement.task
    if not task.is_local:
        peers.check_port_free(task)
    if placement.role == "serve":
        serve(task, connect_timeout=rt.connect_timeout, verbose=verbose, heartbeats=heartbeats)
    # Devices, threads, then the strategy; Keras' precision and seeds after it (collectives come first).
    if traits.coordinator:
        strategies.set_grpc_fail_fast()
    cpu_devices = rt.cpu_devices or strategies.default_cpu_devices(traits)
    try:
        strategies.setup_host(cpu_devices=cpu_devices if traits.local_devices else 1,
                              inter_op_threads=0 if task.is_local else placement.num_tasks + 1)
        # The peers meet (bounded by --connect_timeout) right before the strategy binds the gRPC port.
        with peers.joining(task, rt.connect_timeout, listen_meanwhile=traits.listens_while_joining):
            strategy = strategies.make_strategy(
                rt.strategy, cpu_devices=cpu_devices, cluster_resolver=cluster_resolver,
                communication=rt.communication, bytes_per_pack=rt.bytes_per_pack,
                collective_timeout=rt.collective_timeout,
            )
    except strategies.DevicesFixed as e:
        received = str(e).split(" Expected")[0].rstrip(".")
        raise UserError(f"Invalid set-up order for strategy={rt.strategy!r}: TensorFlow had already started. "
                        f"Received: {received}. {TOO_LATE}") from None
    except RuntimeError as e:
        if "at program startup" not in str(e):  # "Collective ops must be configured at program startup"
            raise
        raise UserError(f"Invalid set-up order for strategy={rt.strategy!r}: TensorFlow had already started, and "
                        f"its collectives can only be configured before. Received: {e}. {TOO_LATE}") from None
    if keras_setup:
        strategies.setup_keras(rt.precision, seed=seed, deterministic=deterministic)
    return Session(runtime=runtime, placement=placement, strategy=strategy)


def setup(runtime, *, verbose: bool = True):
    """Set this process up for ``runtime`` (a ``RuntimeConfig``) once and return its strategy (``tfdist.setup``).

    Called again with the same ``runtime``, the same strategy. Under ``parameter_server`` a ps or worker task
    serves the chief from here and never returns.

    Raises:
      UserError: a bad cluster, a second set-up with other arguments, an evaluator task, or TensorFlow
        already started in a way the strategy cannot use.
    """
    global _current
    typed, runtime = runtime, config_lib.validate_runtime(runtime)  # "auto" resolved
    if _current is not None:
        if _current.runtime == runtime:
            return _current.strategy
        raise UserError(f"Invalid second tfdist.setup: this process is already set up for "
                        f"strategy={_current.runtime.strategy!r}. Received: {_differences(typed, runtime)}. Expected "
                        "one set-up per process, as TensorFlow fixes it when it starts: call tfdist.setup once (again "
                        "only with the same arguments, to get the same strategy).")
    _current = start(runtime, where="tfdist.setup", verbose=verbose, keras_setup=False)
    return _current.strategy


def _differences(typed, runtime) -> str:
    """Each argument of a second ``setup`` that differs from the first's, as the call gave it, with the first's."""
    parts = []
    for field in dataclasses.fields(runtime):
        given, fixed = getattr(runtime, field.name), getattr(_current.runtime, field.name)
        if given != fixed:
            shown = getattr(typed, field.name)
            meaning = f", which is {given!r} here" if shown != given else ""
            parts.append(f"{field.name}={shown!r}{meaning} (set up with {fixed!r})")
    return ", ".join(parts)
