"""User errors and the one way every tfdist CLI reports them.

A mistake the user made (a bad flag, a bad cluster file, a bad dataset) is a
``UserError``: its message is one line that says what was wrong, what was
received and what is expected. CLIs turn it into exit status 2 and that line
on stderr, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Callable, NoReturn, Sequence

USAGE_EXIT_CODE = 2


class UserError(ValueError):
    """An error caused by the user's input, reported as one line with exit status 2."""

    def __init__(self, message: str):
        # One line, always: collapse anything multi-line a caller passed in.
        super().__init__(" ".join(str(message).split()))


class RunFailed(RuntimeError):
    """A run that started well but cannot go on (e.g. a diverged loss); one line, ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def fail(message: str, exit_code: int = USAGE_EXIT_CODE) -> NoReturn:
    """Print ``message`` as one line on stderr and exit with ``exit_code`` (2: the user's error)."""
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise SystemExit(exit_code)


def absl_flags_parser(argv: Sequence[str]) -> list[str]:
    """Parse absl flags; a bad flag becomes one line and exit status 2.

    absl's default parser prints usage and exits 1; tfdist promises 2 and one
    line for every user error, so CLIs pass this to ``app.run(flags_parser=)``.
    """
    from absl import flags

    try:
        return flags.FLAGS(list(argv))
    except flags.Error as e:
        fail(f"invalid command line: {e}")


def run_main(main: Callable[[list[str]], int | None], define_flags: Callable[[], None] | None = None) -> None:
    """Run an absl ``main``: ``UserError`` ends it with status 2, ``RunFailed`` with its own, one line each.

    ``define_flags`` (if given) defines the CLI's flags first; CLIs define
    them only when they run, so that several can be imported in one process.
    """
    from absl import app

    if define_flags is not None:
        define_flags()

    def guarded(argv: list[str]) -> int | None:
        try:
            return main(argv)
        except UserError as e:
            fail(str(e))
        except RunFailed as e:
            fail(str(e), e.exit_code)

    app.run(guarded, flags_parser=absl_flags_parser)
