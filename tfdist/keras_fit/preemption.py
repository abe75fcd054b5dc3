"""Preemption of Keras' own ``fit`` across workers: every worker stops at the same step, saves it, exits 42."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import weakref

from tfdist.runtime.placement import Placement
from tfdist.runtime.preemption import SIGNALS, exit_preempted, signal_name
from tfdist import _compat
from tfdist.errors import preempted_exit

#: The log key that carries the vote out of the step; removed before Keras sees the logs.
VOTE = "_tfdist_preemption_vote"

@contextlib.contextmanager
def around(model, arguments, placement):
    """One Keras ``fit`` across workers (``placement``): the ``PreemptionVote``; every worker's stop at the same
    step ends the process with status 42 and one line (``errors.PreemptedExit``)."""
    if placement is None:
        yield
        return
    try:
        with PreemptionVote(model, placement, list(arguments.get("callbacks") or [])):
            yield
    except Stopped as e:
        raise preempted_exit(str(e)) from None


class Stopped(BaseException):
    """Every worker stopped at the same step and saved it: ``fit`` then raises ``errors.PreemptedExit`` (42).

    A ``BaseException``, so that a user's ``except Exception`` around ``fit`` does not swallow it.
    """


_votes: "weakref.WeakKeyDictionary[object, object]" = weakref.WeakKeyDictionary()


class PreemptionVote:
    """A context manager around one ``fit`` across workers: the vote in every step, the save and exit 42.

    Args:
        model: the Keras model whose ``fit`` runs.
        placement: this worker under the model's ``MultiWorkerMirroredStrategy`` (who it is, whether it is chief).
        callbacks: ``fit``'s callbacks (a ``BackupAndRestore`` among them saves the step reached).
    """

    def __init__(self, model, placement: Placement, callbacks):
        self.model = model
        self.placement = placement
        self.backups = [c for c in callbacks if _is_backup(c)]
        self.received: int | None = None
        self._voted: int | None = None  # the signal this worker voted on; a later one does not change the reason
        self._previous: dict[int, object] = {}
        self._pending = None
        self._steps = 0

    def __enter__(self) -> "PreemptionVote":
        import tensorflow as tf

        if self.model not in _votes:
            with tf.init_scope():
                _votes[self.model] = tf.Variable(0.0, trainable=False, name="tfdist_preemption_vote")
        self.flag = _votes[self.model]
        self.flag.assign(0.0)
        model, flag, train_step = self.model, self.flag, self.model.train_step

        def voting_train_step(data):
            logs = train_step(data)
            return {**logs, VOTE: flag.read_value()} if isinstance(logs, dict) else logs

        model.train_step = voting_train_step
        model.make_train_function(force=True)
        model.train_function = self._wrap(model.train_function)
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:  # after TensorFlow's own hooks, installed with the strategy
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        # Preempted, the process is on its way out with status 42: a further signal (a launcher stopping the
        # other tasks) must not turn it into a death by signal.
        preempted = isinstance(exc, Stopped)
        for signum, handler in self._previous.items():
            signal.signal(signum, exit_preempted if preempted else handler)
        self._previous = {}
        vars(self.model).pop("train_step", None)  # the class' own train_step shows again
        self.model.train_function = None

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def _wrap(self, train_function):
        def voting_train_function(iterator):
            if self.received is not None and not float(self.flag.numpy()):
                self.flag.assign(1.0)
                self._voted = self.received
            if self._pending is not None and float(self._pending) > 0:
                self._stop()
            logs = train_function(iterator)
            self._steps += 1
            if isinstance(logs, dict) and VOTE in logs:
                logs = dict(logs)
                self._pending = logs.pop(VOTE)
            return logs

        return voting_train_function

    def _stop(self) -> None:
        """Every worker, after the same step: save it through ``BackupAndRestore``, then end with status 42."""
        me = self.placement.name
        why = (f"{me} received {signal_name(self._voted)}" if self._voted is not None
               else f"another worker received SIGTERM or SIGUSR1 (this is {me})")
        for backup in self.backups:
            _compat.save_backup(backup)
        if self.backups:
            where = self.backups[0].backup_dir if self.placement.is_chief else "a private copy (not the chief)"
            saved = f"saved the step reached ({self._steps} steps of this fit) to {where}"
        else:
            saved = "nothing was saved: fit has no keras.callbacks.BackupAndRestore callback"
        message = f"preempted: {why}; {saved}. Run the same command again to resume."
        sys.stderr.write(f"tfdist: {message}\n")
        raise Stopped(message)


def _is_backup(callback) -> bool:
    import keras

    return isinstance(callback, keras.callbacks.BackupAndRestore)
