"""Keras' own ``fit`` across workers returns on every worker once the chief has written that ``fit``'s files."""

from __future__ import annotations

import contextlib
import itertools

from tfdist import _compat

#: How long a worker waits at the end of ``fit`` for the slowest one, in seconds (a chief's last upload).
END_TIMEOUT_SECONDS = 3600.0

_fits = itertools.count(1)


def wait_for_every_worker() -> None:
    """Wait until every worker has ended this ``fit`` (one barrier per ``fit``, named by its rank in the process)."""
    _compat.wait_at_barrier(f"tfdist-keras-fit-{next(_fits)}", int(END_TIMEOUT_SECONDS * 1000))


@contextlib.contextmanager
def around(model, arguments, placement):
    """One Keras ``fit``: across workers (``placement``), once it has returned, wait for every worker."""
    yield
    if placement is not None:
        wait_for_every_worker()
