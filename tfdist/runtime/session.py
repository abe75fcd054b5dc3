"""A task's one start (``start``): placed, checked, then serving or set up with its strategy, once per process.

``tfdist.setup`` (``setup``) and every run (``runtime.driver``) start here, before any other TensorFlow op, since
TensorFlow fixes a process's devices and collectives when it starts; a run takes over ``tfdist.setup``'s session.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tfdist import config as config_lib
from tfdist import strategies
from tfdist.cluster import network, peers, sources
from tfdist.errors import UserError
from tfdist.runtime import who
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


def taken_over(runtime, where: str) -> Session | None:
    """The session ``tfdist.setup`` made in this process, which a run of ``where`` takes over (TensorFlow starts
    once), with the run's ``progress_timeout``; None when there is none.

    ``runtime``'s strategy, cluster and task must be the session's, or left to it (``"auto"``, empty).

    Raises:
      UserError: naming the argument of ``where`` that the set-up fixed otherwise.
    """
    session = who.current()
    if session is None:
        return None
    fixed = session.runtime
    if runtime.strategy not in (strategies.AUTO, fixed.strategy):
        raise UserError(f"Invalid `strategy` for {where} after tfdist.setup. Received: strategy={runtime.strategy!r}, "
                        f"and the process is set up for {fixed.strategy!r}. Expected strategy=None, 'auto' or the "
                        "set-up's own.")
    for name in ("cluster", "task"):
        given, kept = getattr(runtime, name), getattr(fixed, name)
        if given and given != kept:
            raise UserError(f"Invalid `{name}` for {where} after tfdist.setup. Received: {name}={given!r}, and the "
                            f"process is set up with {name}={kept!r}. Expected {name}=None or the set-up's own.")
    return dataclasses.replace(session, runtime=dataclasses.replace(fixed, progress_timeout=runtime.progress_timeout))


def start(runtime, placement: Placement | None = None, *, cluster_resolver=None, heartbeats=None,
          verbose: bool = True) -> Session:
    """Start this task, the one way every client does: place it, check its port, then serve (a ps task, or a
    worker under a coordinator: never returns) or set up TensorFlow and the strategy. A process that
    ``tfdist.setup`` set up already is its session: taken over, as TensorFlow starts once (``taken_over``
    reconciles a run's arguments with it first).

    Keras' precision, seed and op determinism are the client's to set once this returns (TensorFlow's
    collectives come first).

    Args:
      runtime: the run's ``RuntimeConfig`` (strategy, devices, cluster, timeouts).
      placement: this process's ``Placement`` when the caller placed it already (to check its run first).
      cluster_resolver: an in-process cluster this process coordinates, or None.
      heartbeats: where a serving task writes its heartbeats (a run directory's), or None.
      verbose: a serving task prints what it does.

    Returns:
      The ``Session``; ``setup`` keeps it as the process's (``who.current``), a run of ``fit`` or ``train`` does
      not (one process may run several, as TensorFlow allows).

    Raises:
      UserError: a taken port, a cluster that does not fit, or TensorFlow started in a way the strategy cannot
        use.
    """
    if who.current() is not None:
        return who.current()
    if placement is None:
        placement = place(runtime, in_process=cluster_resolver is not None)
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
    return Session(runtime=runtime, placement=placement, strategy=strategy)


def setup(runtime, *, verbose: bool = True):
    """Set this process up for ``runtime`` (a ``RuntimeConfig``) once and return its strategy (``tfdist.setup``).

    Called again with the same ``runtime``, the same strategy. Under ``parameter_server`` a ps or worker task
    serves the chief from here and never returns.

    Raises:
      UserError: a bad cluster, a second set-up with other arguments, an evaluator task, or TensorFlow
        already started in a way the strategy cannot use.
    """
    typed, runtime = runtime, config_lib.validate_runtime(runtime)  # "auto" resolved
    first = who.current()
    if first is not None:
        if first.runtime == runtime:
            return first.strategy
        differences = _differences(typed, runtime, first.runtime)
        raise UserError(f"Invalid second tfdist.setup: this process is already set up for "
                        f"strategy={first.runtime.strategy!r}. Received: {differences}. Expected one set-up per "
                        "process, as TensorFlow fixes it when it starts: call tfdist.setup once (again only with the "
                        "same arguments, to get the same strategy).")
    placement = place(runtime)
    placement.refuse_evaluator("tfdist.setup", "an evaluator calls tfdist.fit without tfdist.setup, or runs "
                                                "`python -m tfdist.train`")
    session = start(runtime, placement, verbose=verbose)
    who.remember(session)
    return session.strategy


def _differences(typed, runtime, first) -> str:
    """Each argument of a second ``setup`` that differs from the ``first``'s runtime, as the call gave it, with the
    first's."""
    parts = []
    for field in dataclasses.fields(runtime):
        given, fixed = getattr(runtime, field.name), getattr(first, field.name)
        if given != fixed:
            shown = getattr(typed, field.name)
            meaning = f", which is {given!r} here" if shown != given else ""
            parts.append(f"{field.name}={shown!r}{meaning} (set up with {fixed!r})")
    return ", ".join(parts)
