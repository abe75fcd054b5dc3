"""``compile(steps_per_execution=N)`` in Keras' own ``fit`` and ``evaluate`` over several replicas.

Keras runs N steps in one ``tf.function``: a ``tf.while_loop`` whose ``tf.cond`` calls the step. TensorFlow
feeds each collective's instance key when the function is called, and that feed never reaches a collective
nested so ("You must feed a value for placeholder tensor 'while/.../cond/Placeholder'"). While Keras'
function traces, its collectives take their keys when traced instead: every worker traces the same functions
in the same order, so the keys agree.
"""

from __future__ import annotations

import functools

from tfdist import _compat


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
            if self.steps_per_execution > 1 and self.distribute_strategy.num_replicas_in_sync > 1:
                with _compat.collective_keys_at_trace_time():
                    return function(iterator)
            return function(iterator)

        return run

    _make_function.tfdist_executions = True
    return _make_function
