"""The check's tolerance in numbers: a difference of tens of measured float32 noise floors (the drift training
adds to rounding over a few steps) counts as equal, one a thousand floors off differs.

The figures are stated here, not through the check's own constants: the floor is the one measured on this stack
between 1 and 2 replicas (``1e-7`` in the loss of a small classifier), and the difference that must be found is of
the size of a real one (plain batch norm on 2 replicas drifted ``2.5e-4`` from one device after 5 steps), a
thousand floors, far inside what a tolerance of ten thousand floors would let through.
"""

from __future__ import annotations

import numpy as np

from tfdist.check import verdict

#: The float32 noise floor between 1 and 2 replicas, measured on this stack (a relative difference in the loss).
FLOOR = 1e-7


def _result(last_loss: float = 0.5) -> dict:
    """A trained case's figures: its History, weights, optimizer state, copies, evaluation and predictions."""
    return {"history": {"loss": [1.0, last_loss]}, "weights": [np.full((2, 2), 1.0)], "learning_rate": 0.01,
            "iterations": 4, "copies": 0.0, "evaluate": {"loss": 0.4}, "predict": [np.ones(3)]}


def _tolerance() -> float:
    """The tolerance the check derives from a control case whose loss lies one floor off one device."""
    control = _result(0.5 * (1 + FLOOR))
    return verdict.tolerance(verdict.noise_floor(control, _result()))


def test_a_difference_a_thousand_noise_floors_off_differs():
    found = verdict.verdict(_result(0.5 * (1 + 1000 * FLOOR)), _result(), tol=_tolerance())
    assert found["class"] == "differs" and found["detail"].startswith("history"), found


def test_a_difference_of_tens_of_noise_floors_is_equal():
    assert verdict.verdict(_result(0.5 * (1 + 30 * FLOOR)), _result(), tol=_tolerance())["class"] == "equal"
