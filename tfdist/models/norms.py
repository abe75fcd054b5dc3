"""The UNet's normalizations by name (``--norm``), without Keras: the experiment checks ``--norm`` before Keras
starts, and the UNet builds what the name asks for."""

from __future__ import annotations

from tfdist.config import check_choice
from tfdist.errors import UserError

#: The ``--norm`` names: batch (exact, all-reduced), group (exact, no collective), replica_batch (each replica
#: its own statistics), none.
NORMS = ("batch", "group", "replica_batch", "none")


def resolve_norm(norm: str, batch_norm: bool) -> str:
    """The normalization that ``norm`` and the older ``batch_norm`` switch ask for together.

    ``batch_norm=False`` (``--nobatch_norm``) means no normalization: it turns the default ``"batch"``
    into ``"none"``; with ``"group"`` or ``"replica_batch"`` the pair contradicts itself and is refused.
    """
    check_choice("norm", norm, NORMS)
    if batch_norm:
        return norm
    if norm not in ("batch", "none"):
        raise UserError(
            f"Invalid value for `--norm` with --nobatch_norm. Received: norm={norm!r} and batch_norm=False. "
            f"Expected norm='none' (or no --norm) with --nobatch_norm, or --batch_norm with norm={norm!r}."
        )
    return "none"
