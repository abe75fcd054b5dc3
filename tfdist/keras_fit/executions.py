"""``compile(steps_per_execution=N)`` in Keras' own ``fit`` and ``evaluate`` across workers."""

from __future__ import annotations

import contextlib
import functools

from tfdist import _compat
from tfdist.errors import UserError


def install() -> None:
    """Wrap Keras' ``_make_function`` (train and test steps) once per process."""
    cls = _compat.keras_tensorflow_trainer().TensorFlowTrainer
    if getattr(cls._make_function, "tfdist_executions", False):
        return
    cls._make_function = _keys_at_trace_time(cls._make_function)


def _keys_at_trace_time(make_function):
    @functools.wraps(make_function)
    def _make_function(self, step_function):
        function = make_function(self, step_function)

        def run(iterator):
            if self.steps_per_execution > 1 and _compat.is_multi_worker(self.distribute_strategy):
                with _compat.collective_keys_at_trace_time():
                    return function(iterator)
            return function(iterator)

        return run

    _make_function.tfdist_executions = True
    return _make_function


@contextlib.contextmanager
def around(model, arguments, placement):
    """One Keras ``fit`` over several replicas of one process (no ``placement``): ``refuse_in_one_process``."""
    if placement is None and model.distribute_strategy.num_replicas_in_sync > 1:
        refuse_in_one_process(model)
    yield


def refuse_in_one_process(model) -> None:
    """Refuse ``steps_per_execution > 1`` in Keras' own ``fit`` over several replicas of one process (one line).

    Raises:
        UserError: ``model.steps_per_execution`` is above 1.
    """
    if model.steps_per_execution > 1:
        raise UserError(
            f"Invalid compile(steps_per_execution={model.steps_per_execution}) for Keras' own fit over "
            f"{model.distribute_strategy.num_replicas_in_sync} replicas in one process: Keras runs the steps in "
            "a loop whose collectives TensorFlow cannot feed there (Keras fails the same way without tfdist). "
            "Received: steps_per_execution>1. Expected steps_per_execution=1, or tfdist.fit, which runs "
            "steps_per_execution steps per call under every strategy."
        )
