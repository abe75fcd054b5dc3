"""``fitting.global_gradients.check``: a Keras whose optimizer lacks a method the wrapping needs is one line."""

from __future__ import annotations

import pytest

from tfdist.errors import UserError
from tfdist.fitting import global_gradients


def test_an_optimizer_without_a_wrapped_method_is_refused_in_one_line():
    from keras.optimizers import LossScaleOptimizer, Optimizer


    class StandIn:
        _apply_weight_decay = _backend_increment_gradient_accumulators = staticmethod(lambda *a: None)
        _overwrite_model_variables_with_average_value = apply = staticmethod(lambda *a: None)

    with pytest.raises(UserError, match=r"^Unsupported Keras .*StandIn\._backend_update_step") as error:
        global_gradients.check(StandIn, Optimizer, LossScaleOptimizer)
    assert "\n" not in str(error.value)
    global_gradients.check(Optimizer, Optimizer, LossScaleOptimizer)  # Keras' own classes pass
