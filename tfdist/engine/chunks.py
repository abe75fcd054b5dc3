"""How many steps one call of the loop runs: with no hook that needs each loop's end, a chunk grows past
``steps_per_loop`` (one ``tf.function`` call, one host read and one pass of the controller's Python for all its
steps), bounded by time, so a stop vote and the watchdog's deadline are answered within a fraction of a second
more than after one step. Every task of a synchronous cluster runs the same chunks: each task's proposal, from its
own clock, travels in the all-reduce the step makes anyway, and all take the same size from the sum.
"""

from __future__ import annotations

#: Seconds a grown chunk is meant to take, at the step time measured so far.
CHUNK_SECONDS = 0.25
#: A grown chunk takes at most this share of the watchdog's ``--progress_timeout``.
TIMEOUT_SHARE = 0.05
#: The most steps a chunk holds: a proposal summed over up to 1024 replicas stays exact in float32 (2**24).
MAX_STEPS = 1 << 14


class ChunkSize:
    """The steps of the next chunk: ``unit`` (``steps_per_loop``), or when ``grow`` a multiple of it.

    This task proposes (``proposal``) the steps that fit in ``seconds`` at
    the rate its last timed chunk ran at, at most twice its last proposal:
    a slower step (a loaded machine, a bigger model) makes it shorter at
    once. The loop sends the proposal with a chunk's steps and gives back
    (``agreed``) what every task's proposals, summed in the step's
    all-reduce, make: the size of the chunk after it, the same on every
    task. So a proposal sizes the chunk after next, and a chunk at most
    doubles from one to the next.

    Args:
      unit: the steps of a chunk that does not grow, and the multiple a grown one is of.
      grow: whether chunks may join several units.
      seconds: how long a grown chunk is meant to take.
    """

    def __init__(self, unit: int, *, grow: bool, seconds: float = CHUNK_SECONDS):
        self.unit = max(1, unit)
        self.grow = grow
        self.seconds = seconds
        self.steps = self.unit  # the next chunk's, as every task agreed
        self.proposal = self.unit  # this task's, for a later chunk

    def measured(self, steps: int, elapsed: float) -> None:
        """A timed chunk of ``steps`` took ``elapsed`` seconds: this task's next proposal."""
        if not self.grow or steps <= 0:
            return
        fits = int(self.seconds * steps / elapsed) if elapsed > 0 else 2 * self.proposal
        units = max(1, min(2 * self.proposal, fits, MAX_STEPS) // self.unit)
        self.proposal = units * self.unit

    def agreed(self, steps: int) -> None:
        """Every task agreed on ``steps`` (the mean of their proposals) for the next chunk: a multiple of
        ``unit``."""
        if self.grow:
            self.steps = max(1, min(steps, MAX_STEPS) // self.unit) * self.unit


def chunk_seconds(progress_timeout: float) -> float:
    """The time bound of a grown chunk under a watchdog's ``progress_timeout`` (0: no deadline)."""
    return min(CHUNK_SECONDS, TIMEOUT_SHARE * progress_timeout) if progress_timeout else CHUNK_SECONDS
