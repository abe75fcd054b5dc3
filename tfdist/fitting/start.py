"""Where a ``tfdist.fit`` run starts: tfdist's own checkpoint, a ``BackupAndRestore``'s backup or ``initial_epoch``,
and which of its input's batches it skips.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a run starts.

    Attributes:
      step: the step it starts at (the state's step counter holds it).
      skipped: the batches of its input read before that step (0: it reads its input from the beginning).
    """

    step: int
    skipped: int


def start_of(state, strategy, placement, *, callbacks, epoch_steps: int, initial_epoch: int,
             connect_timeout: float) -> Start:
    """Move ``state``'s step to where the fit starts, as Keras' ``fit`` starts, and return that ``Start``.

    A ``BackupAndRestore``'s backup sets the epoch to start at (over
    ``initial_epoch``), unless tfdist's own checkpoint (``state.restored``)
    holds a later one; a fresh run starts at ``initial_epoch``. A fit that starts
    at ``initial_epoch`` or at a backup's epoch reads its input from the
    beginning, as Keras' ``fit`` does (a new iterator); one that resumes tfdist's
    own checkpoint reads on from the step it holds.

    Args:
      state: the run's ``engine.state.TrainingState``, restored.
      strategy: the run's strategy (a backup is read under its scope).
      placement: this task's ``runtime.placement.Placement`` (every worker reads a backup together).
      callbacks: the fit's Keras callbacks.
      epoch_steps: steps an epoch.
      initial_epoch: ``tfdist.fit``'s.
      connect_timeout: seconds every worker waits for the others before a backup is read.
    """
    from tfdist.fitting.callbacks import restore_backups

    with strategy.scope():
        backup_epoch = restore_backups(callbacks, state.model, epoch_steps=epoch_steps,
                                       resumed_step=int(state.step.numpy()) if state.restored else None,
                                       wait=functools.partial(_every_worker, placement, connect_timeout))
    if backup_epoch:
        state.step.assign(backup_epoch * epoch_steps)
    elif not state.restored and initial_epoch:
        state.step.assign(initial_epoch * epoch_steps)
    step = int(state.step.numpy())
    return Start(step=step, skipped=0 if backup_epoch or (not state.restored and initial_epoch) else step)


_backup_reads = itertools.count(1)


def _every_worker(placement, timeout: float) -> None:
    """Wait until every worker of a strategy that ends with a barrier (``multi_worker_mirrored``) is here: before a
    ``BackupAndRestore`` backup is read (one barrier per ``fit``, named by its rank in the process)."""
    from tfdist import _compat

    if placement.traits.ends_with_barrier and placement.task.training_spec.num_tasks >= 2:
        _compat.wait_at_barrier(f"tfdist-fit-backup-{next(_backup_reads)}", int(timeout * 1000))
