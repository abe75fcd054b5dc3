"""A training task's life in its cluster, for every client (``tfdist.train``'s experiment and ``tfdist.fit``).

``training_task`` is the context a client trains in: a serving task serves
instead (and never returns); a training task sets up TensorFlow and the
strategy, trains inside the ``with`` block under ``Preemption`` and
``peer_errors``, finishes with its peers, and under a coordinator tells the
serving tasks how the run ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from tfdist.cluster import peers
from tfdist.errors import DONE_EXIT_CODE, USAGE_EXIT_CODE, RunFailed, UserError
from tfdist.rundir import RunDir
from tfdist.runtime.peer_errors import finish_together, peer_errors
from tfdist.runtime.placement import Placement
from tfdist.runtime.preemption import Preemption
from tfdist.runtime.serving import serve, tell_servers
from tfdist.runtime.session import setup_tensorflow


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
def training_task(config, placement: Placement, run_dir: RunDir, *, cluster_resolver=None, verbose: bool = True,
                  keras_setup: bool = True, strategy=None) -> Iterator[Training]:
    """Set this task up and yield its ``Training``; the block trains.

    Args:
      config: the run's config (its ``runtime`` section: strategy, devices, timeouts).
      placement: this task.
      run_dir: the run directory (heartbeats of a serving task, the latest checkpoint of a lost-peer line).
      cluster_resolver: an in-process cluster this process coordinates, or None.
      verbose: a serving task prints what it does.
      keras_setup: set Keras' precision policy, seeds and determinism from ``config`` (False: leave them as
        the caller set them, as Keras' own ``fit`` does).
      strategy: the strategy a ``tfdist.setup`` made already, or None to make it here.
    """
    rt = config.runtime
    if placement.task is not None and strategy is None:
        peers.check_port_free(placement.task)
    if placement.role == "serve":
        serve(placement.task, connect_timeout=rt.connect_timeout, verbose=verbose, heartbeats=run_dir.heartbeats)
    with Preemption(placement.name) as preemption:
        try:
            if strategy is None:
                strategy = setup_tensorflow(config, placement, cluster_resolver, keras_setup=keras_setup)
            with peer_errors(placement, run_dir):
                yield Training(placement=placement, run_dir=run_dir, strategy=strategy, preemption=preemption,
                               progress_timeout=rt.progress_timeout)
                finish_together(placement, rt.connect_timeout)
        except (RunFailed, UserError) as e:
            if placement.coordinator:
                tell_servers(placement, e.exit_code if isinstance(e, RunFailed) else USAGE_EXIT_CODE)
            raise
    if placement.coordinator:
        tell_servers(placement, DONE_EXIT_CODE)
