"""A training task's life in its cluster, for every client (``tfdist.train``'s experiment and ``tfdist.fit``).

``training_task`` starts the task (``session.start``) and trains its ``with`` block under ``Preemption`` and
``peer_errors``; it finishes with its peers and, under a coordinator, tells the serving tasks how the run ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from tfdist.errors import DONE_EXIT_CODE, USAGE_EXIT_CODE, RunFailed, UserError
from tfdist.rundir import RunDir
from tfdist.runtime.peer_errors import finish_together, peer_errors
from tfdist.runtime.placement import Placement
from tfdist.runtime.preemption import Preemption
from tfdist.runtime.serving import tell_servers
from tfdist.runtime.session import start


@dataclasses.dataclass(frozen=True)
class Training:
    """What a training task trains with (``runtime.run_loop`` takes it).

    Attributes:
      placement: this task.
      run_dir: the run directory (heartbeats).
      strategy: the ``tf.distribute.Strategy``.
      preemption: this task's ``Preemption``.
      progress_timeout: ``--progress_timeout``, the watchdog's bound.
    """

    placement: Placement
    run_dir: RunDir
    strategy: Any
    preemption: Preemption
    progress_timeout: float


@contextlib.contextmanager
def training_task(runtime, placement: Placement, run_dir: RunDir, *, where: str, cluster_resolver=None,
                  verbose: bool = True, keras_setup: bool = True, seed: int = 0, deterministic: bool = False,
                  session=None) -> Iterator[Training]:
    """Start this task (``session.start``) unless ``session`` is given, and yield its ``Training``; the block trains.

    Args:
      runtime: the run's ``RuntimeConfig`` (strategy, devices, timeouts).
      placement: this task.
      run_dir: the run directory (heartbeats of a serving task, the latest checkpoint of a lost-peer line).
      where: the client, for messages (``tfdist.fit``, ``tfdist.train``).
      cluster_resolver: an in-process cluster this process coordinates, or None.
      verbose: a serving task prints what it does.
      keras_setup: set Keras' precision policy, ``seed`` and ``deterministic`` (False: leave them as the
        caller set them, as Keras' own ``fit`` does).
      seed, deterministic: the run's seed and op determinism, for ``keras_setup``.
      session: the ``Session`` a ``tfdist.setup`` made already, or None to start one here.
    """
    def started():
        return start(runtime, placement, where=where, cluster_resolver=cluster_resolver,
                     heartbeats=run_dir.heartbeats, verbose=verbose, keras_setup=keras_setup, seed=seed,
                     deterministic=deterministic)

    if session is None and placement.role == "serve":
        started()  # serves, with its own signal handling, and never returns
    with Preemption(placement.name) as preemption:
        try:
            strategy = (session or started()).strategy
            with peer_errors(placement, run_dir):
                yield Training(placement=placement, run_dir=run_dir, strategy=strategy, preemption=preemption,
                               progress_timeout=runtime.progress_timeout)
                finish_together(placement, runtime.connect_timeout)
        except (RunFailed, UserError) as e:
            if placement.coordinator:
                tell_servers(placement, e.exit_code if isinstance(e, RunFailed) else USAGE_EXIT_CODE)
            raise
    if placement.coordinator:
        tell_servers(placement, DONE_EXIT_CODE)
