"""How many steps one call of the loop runs: with no hook that needs each loop's end, a chunk grows past
``steps_per_loop`` (one ``tf.function`` call, one host read and one pass of the controller's Python for all its
steps), bounded by time, so a stop vote and the watchdog's deadline are answered within a fraction of a second
more than after one step.
"""

from __future__ import annotations

#: Seconds a grown chunk is meant to take, at the step time measured so far.
CHUNK_SECONDS = 0.25
#: A grown chunk takes at most this share of the watchdog's ``--progress_timeout``.
TIMEOUT_SHARE = 0.05


class ChunkSize:
    """The steps of the next chunk: ``unit`` (``steps_per_loop``), or when ``grow`` a multiple of it.

    A grown chunk at most doubles from one chunk to the next, and holds the
    steps that fit in ``seconds`` at the rate the last timed chunk ran at: a
    slower step (a loaded machine, a bigger model) makes the next chunk
    shorter at once.

    Args:
      unit: the steps of a chunk that does not grow, and the multiple a grown one is of.
      grow: whether chunks may join several units.
      seconds: how long a grown chunk is meant to take.
    """

    def __init__(self, unit: int, *, grow: bool, seconds: float = CHUNK_SECONDS):
        self.unit = max(1, unit)
        self.grow = grow
        self.seconds = seconds
        self.steps = self.unit

    def measured(self, steps: int, elapsed: float) -> None:
        """A timed chunk of ``steps`` took ``elapsed`` seconds: size the next one."""
        if not self.grow or steps <= 0:
            return
        fits = int(self.seconds * steps / elapsed) if elapsed > 0 else 2 * self.steps
        units = max(1, min(2 * self.steps, fits) // self.unit)
        self.steps = units * self.unit


def chunk_seconds(progress_timeout: float) -> float:
    """The time bound of a grown chunk under a watchdog's ``progress_timeout`` (0: no deadline)."""
    return min(CHUNK_SECONDS, TIMEOUT_SHARE * progress_timeout) if progress_timeout else CHUNK_SECONDS
