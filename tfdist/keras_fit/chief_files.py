"""Keras' own ``fit`` across workers: the callbacks run on every worker, their files are the chief's."""

from __future__ import annotations

import contextlib

from tfdist.one_device.chief_files import chief_only_files


def around(model, arguments, placement):
    """One Keras ``fit`` across workers (``placement``): ``chief_only_files`` of its callbacks."""
    if placement is None:
        return contextlib.nullcontext()
    return chief_only_files(list(arguments.get("callbacks") or []), placement)
