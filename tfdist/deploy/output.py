"""A deployment CLI's output (``tfdist.tfconfig``, ``tfdist.manifest``): stdout, or the file ``--output`` names."""

from __future__ import annotations

import sys
from pathlib import Path

from tfdist.errors import UserError, special_file


def write_output(text: str, output: str | None) -> None:
    """Write ``text`` to the file ``output``, or to stdout when it is None or empty.

    Raises:
      UserError: ``output`` cannot be written.
    """
    if not output:
        sys.stdout.write(text)
        return
    special = special_file(output)
    if special:  # writing a FIFO waits for a reader, a device takes the bytes
        raise UserError(f"Invalid value for `--output`: {output} is {special}, not a regular file. Received: "
                        f"output={output!r}. Expected a writable file path.")
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"Cannot write `--output`: {e.strerror or type(e).__name__}. Received: output={output!r}. "
                        "Expected a writable file path.") from None
