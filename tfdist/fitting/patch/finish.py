"""Keras' own ``fit`` across workers returns on every worker once the chief has written that ``fit``'s files.

Scripts read, on every worker, what the chief's callbacks wrote during ``fit``
(the keras.io guide's ``make_or_restore_model()``, a tutorial's
``load_weights(tf.train.latest_checkpoint(...))``). Without a wait, a worker
could read the previous epoch's file or none. Every worker meets the others at
the coordination service's barrier after ``fit``, as TensorFlow's own
``BackupAndRestore`` does; the chief arrives once its ``on_train_end`` is done.
"""

from __future__ import annotations

import itertools

from tfdist import _compat

#: How long a worker waits at the end of ``fit`` for the slowest one, in seconds (a chief's last upload).
END_TIMEOUT_SECONDS = 3600.0

_fits = itertools.count(1)


def wait_for_every_worker() -> None:
    """Wait until every worker has ended this ``fit`` (one barrier per ``fit``, named by its rank in the process)."""
    _compat.wait_at_barrier(f"tfdist-keras-fit-{next(_fits)}", int(END_TIMEOUT_SECONDS * 1000))
