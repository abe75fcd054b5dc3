"""Keras' own ``fit`` over several replicas says that unsynchronized batch norm differs from one device."""

from __future__ import annotations

import contextlib

from tfdist.one_device.batch_norm import warn_unsynchronized_batch_norm


@contextlib.contextmanager
def around(model, arguments, placement):
    """One Keras ``fit``: ``warn_unsynchronized_batch_norm`` before it runs."""
    warn_unsynchronized_batch_norm(model, model.distribute_strategy.num_replicas_in_sync)
    yield
