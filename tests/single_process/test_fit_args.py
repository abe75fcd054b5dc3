"""``tfdist.fit``'s misuse: each bad argument is one ``UserError`` line naming it, before any set-up.

The process is never set up here: ``resolve_cluster`` and ``run_task`` (the
cluster, then TensorFlow and the strategy) are replaced by functions that
fail the test, so a check that came after them would show as that failure,
not as the expected line.
"""

from __future__ import annotations

import numpy as np
import pytest

import tfdist
from tfdist.training import fit as fit_module
from unit.test_fit_args import X, Y, model_fn


@pytest.fixture
def never_set_up(monkeypatch):
    """Fail the test if ``tfdist.fit`` reaches the cluster or the strategy's set-up."""
    def reached(*args, **kwargs):
        raise AssertionError("the process was set up before the arguments were checked")

    monkeypatch.setattr(fit_module, "resolve_cluster", reached)
    monkeypatch.setattr(fit_module, "run_task", reached)


def test_good_arguments_reach_the_set_up(never_set_up):
    # The same call without a mistake goes on to the cluster: the checks above are not refusing everything.
    with pytest.raises(AssertionError, match="the process was set up"):
        tfdist.fit(model_fn, X, Y, batch_size=4, epochs=2, steps_per_epoch=2, validation_steps=1,
                   validation_data=(X, Y, np.ones(8)), sample_weight=np.ones(8), strategy="mirrored", verbose=0)
