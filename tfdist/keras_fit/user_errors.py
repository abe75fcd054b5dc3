"""A tfdist error that leaves a user's script ends it with one line and its status, as tfdist's own CLIs do; and a
collective that fails in Keras' own ``fit`` across workers is such a line, naming the collective and the worker."""

from __future__ import annotations

import contextlib
import sys

from tfdist.errors import USAGE_EXIT_CODE, RunFailed, UserError, collective_failure, end_process


_installed = False


def install() -> None:
    """Chain ``sys.excepthook`` so that an uncaught ``UserError`` is one line and status 2, and an uncaught
    ``RunFailed`` one line and its own status; once per process, so that a hook chained after it
    (``runtime.serving.tell_servers_at_exit``) stays in front of it."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        if not issubclass(kind, (UserError, RunFailed)):
            return previous(kind, value, traceback)
        sys.stdout.flush()
        sys.stderr.write(f"error: {' '.join(str(value).split())}\n")
        # A failed run ends without Python's teardown, which would wait on the collectives of its peers.
        end_process(USAGE_EXIT_CODE if issubclass(kind, UserError) else value.exit_code)

    sys.excepthook = excepthook


@contextlib.contextmanager
def around(model, arguments, placement):
    """One Keras ``fit`` across workers (``placement``): a collective that fails is one ``CollectiveFailed`` line.

    Raises:
        CollectiveFailed: a collective of this ``fit`` failed (``errors.collective_failure``).
    """
    if placement is None:
        yield
        return
    try:
        yield
    except Exception as error:
        failed = collective_failure(error, placement.name, placement.num_workers, "Keras' fit")
        if failed is None:
            raise
        raise failed from None
