"""A ``UserError`` that leaves a user's script ends it with one line and status 2, and a ``RunFailed`` with one line
and its own status, as tfdist's own CLIs do."""

from __future__ import annotations

import sys

from tfdist.errors import USAGE_EXIT_CODE, RunFailed, UserError, end_process


_installed = False


def install() -> None:
    """Chain ``sys.excepthook`` so that an uncaught ``UserError`` is one line and status 2 (a ``RunFailed``, one line
    and its ``exit_code``); once per process, so that a hook chained after it
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
        end_process(value.exit_code if isinstance(value, RunFailed) else USAGE_EXIT_CODE)

    sys.excepthook = excepthook
