"""The command-line plumbing every tfdist CLI shares: ``run_main`` (a user error is one line and status 2, a failed
run its own status), absl's flags parsed to that promise, renamed and retired flags with their notes.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Collection, Mapping, NoReturn, Sequence

from tfdist.errors import USAGE_EXIT_CODE, RunFailed, UserError, check_keras_backend, end_process


def fail(message: str, exit_code: int = USAGE_EXIT_CODE) -> NoReturn:
    """Print ``message`` as one line on stderr and exit with ``exit_code`` (2: the user's error)."""
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise SystemExit(exit_code)


def only_flags(argv: Sequence[str]) -> None:
    """Refuse words that absl left over after the flags (``argv[1:]``): a CLI that takes flags only would
    otherwise ignore them (a value given to a boolean flag, a mistyped flag without its dashes).

    Raises:
        UserError: ``argv`` holds more than the program's name.
    """
    if len(argv) > 1:
        raise UserError(f"Unexpected arguments. Received: {' '.join(argv[1:])!r}. Expected only --flags.")


def absl_flags_parser(argv: Sequence[str]) -> list[str]:
    """Parse absl flags; a bad flag becomes one line and exit status 2.

    absl's default parser prints usage and exits 1; tfdist promises 2 and one
    line for every user error, so CLIs pass this to ``app.run(flags_parser=)``.
    """
    from absl import flags

    try:
        return flags.FLAGS(list(argv))
    except (flags.Error, ValueError) as e:  # absl raises ValueError for a value given to --noflag
        fail(f"invalid command line: {e}")


def require_finite(*names: str, flag_values=None) -> None:
    """Refuse NaN and infinity for the float flags ``names`` when they are parsed (one line, status 2).

    absl's ``lower_bound`` lets both through (NaN compares false both ways), and a wait
    of NaN or infinite seconds never ends.
    """
    import math

    from absl import flags

    for name in names:
        flags.register_validator(name, lambda value: value is None or math.isfinite(value),
                                 message=f"--{name} must be a finite number of seconds",
                                 flag_values=flag_values or flags.FLAGS)


def rename_flags(argv: Sequence[str], renamed: Mapping[str, str],
                 booleans: Collection[str] | None = None) -> tuple[list[str], list[str]]:
    """``argv`` with each old flag name of ``renamed`` (old -> new) spelled as its new name; the old names given.

    ``--old``, ``--old=V``, ``--noold`` and the one-dash forms are renamed up to ``--``;
    what follows ``--`` belongs to another command and is left as it is. ``--noold`` is renamed only where the
    new flag is one of ``booleans`` (None: all are), so that absl reports any other as the user typed it.
    """
    out, given = list(argv[:1]), []
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "--":
            out += argv[i:]
            break
        dashes = "--" if arg.startswith("--") else "-" if arg.startswith("-") else ""
        name, eq, value = arg[len(dashes):].partition("=")
        negated = (name.startswith("no") and name[2:] in renamed and not eq
                   and (booleans is None or renamed[name[2:]] in booleans))
        old = name[2:] if negated else name
        if dashes and old in renamed:
            given.append(old)
            arg = f"{dashes}{'no' if negated else ''}{renamed[old]}{eq}{value}"
        out.append(arg)
    return out, given


#: A note that a deprecated command, which runs another in its place (``os.execv``), leaves for ``run_main``.
NOTE_ENV = "TFDIST_DEPRECATION_NOTE"


def run_main(main: Callable[[list[str]], int | None], define_flags: Callable[[], None] | None = None,
             renamed: Mapping[str, str] | None = None, retired: Mapping[str, str] | None = None) -> None:
    """Run an absl ``main``: ``UserError`` ends it with status 2, ``RunFailed`` with its own, one line each.

    A ``RunFailed`` ends the process at once after its line (``end_process``), so
    that the line is the last one and TensorFlow's teardown cannot wait on a
    lost peer.

    ``define_flags`` (if given) defines the CLI's flags first; CLIs define
    them only when they run, so that several can be imported in one process.
    ``renamed`` (old -> new flag name) keeps old flags working: each old name
    given is one ``note:`` line on stderr once ``main`` has returned (a user
    error stays the only line), as is a deprecated command's note (``NOTE_ENV``). ``retired`` (flag name -> why
    it has no effect) names flags that are still defined and accepted but do nothing: each given is such a note.

    TensorFlow's start-up lines are kept off stderr from here on (``quiet``;
    opt-out ``TFDIST_TF_LOGS=1``), so the error line stays the only one. A Keras backend
    other than TensorFlow's is refused first (``check_keras_backend``).
    """
    try:
        check_keras_backend()
    except UserError as e:
        fail(str(e))
    from absl import app

    from tfdist import quiet

    quiet.install()
    if define_flags is not None:
        define_flags()
    from absl import flags

    renamed = renamed or {}
    booleans = [new for new in renamed.values() if new in flags.FLAGS and flags.FLAGS[new].boolean]
    sys.argv[:], old_names = rename_flags(sys.argv, renamed, booleans)
    note = os.environ.pop(NOTE_ENV, None)

    def guarded(argv: list[str]) -> int | None:
        try:
            status = main(argv)
            for old in old_names:
                sys.stderr.write(f"note: --{old} is deprecated; use --{renamed[old]} (the same flag, renamed)\n")
            for name, why in (retired or {}).items():
                if flags.FLAGS[name].present:
                    sys.stderr.write(f"note: --{name} is deprecated and has no effect: {why}\n")
            if note:
                sys.stderr.write(f"note: {note}\n")
            return status
        except UserError as e:
            quiet.drain()
            fail(str(e))
        except RunFailed as e:
            quiet.drain()
            # A run that failed ends here, without Python's teardown: TensorFlow's would reach for peers
            # that are gone (lines of gRPC errors after this one, or a wait), and nothing is left to flush.
            try:
                fail(str(e), e.exit_code)
            finally:
                end_process(e.exit_code)

    app.run(guarded, flags_parser=absl_flags_parser)
