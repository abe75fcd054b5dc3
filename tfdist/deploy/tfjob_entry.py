"""``python -m tfdist.deploy.tfjob_entry COMMAND``: a TFJob container's first process, passing signals on."""

from __future__ import annotations

import signal
import subprocess
import sys

from tfdist.errors import PREEMPTED_EXIT_CODE

#: The TFJob container's status when ``tfdist.train`` exited 42. The operator's ``ExitCode`` policy retries 128
#: and above (only 130, 137, 138 and 143 in older versions, 138 = 128 + SIGUSR1 being its "user-defined
#: retryable error"); any status under 128, 42 included, fails the TFJob for good.
TFJOB_PREEMPTED_EXIT_CODE = 138

#: The signals passed on to the child.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def container_status(status: int) -> int:
    """The container's exit status for the child's ``Popen.wait()`` status ``status``."""
    if status == PREEMPTED_EXIT_CODE:
        return TFJOB_PREEMPTED_EXIT_CODE
    return 128 - status if status < 0 else status


def main(argv: list[str]) -> int:
    """Run ``argv`` as a child, forward the signals this process gets, and return its container status.

    A signal that arrives before the child exists is kept and sent to it as soon as it starts.
    """
    if not argv:
        sys.stderr.write("error: Missing command for tfdist.deploy.tfjob_entry. Received: no arguments. "
                         "Expected the command to run, e.g. python -m tfdist.train --strategy ...\n")
        return 2
    child: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(signum, frame):
        if child is None:
            pending.append(signum)
        else:
            child.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        child = subprocess.Popen(argv)
    except OSError as e:
        sys.stderr.write(f"error: Cannot start {argv[0]!r}: {e.strerror}. Received: {' '.join(argv)}. "
                         "Expected a command on the container's PATH.\n")
        return 127
    for signum in pending:
        child.send_signal(signum)
    return container_status(child.wait())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
