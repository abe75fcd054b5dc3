"""``compile(steps_per_execution=N)`` in Keras' own ``fit`` and ``evaluate`` across workers.

Keras runs N steps in one ``tf.function``: a ``tf.while_loop`` whose ``tf.cond``
calls the step, itself a ``tf.function``. Across workers TensorFlow gives each
collective an instance key fed when the function is called, and that feed
never reaches a collective so nested ("You must feed a value for placeholder
tensor 'while/.../cond/Placeholder'"). While Keras' function traces, its
collectives take their keys when traced instead: every worker traces the same
functions in the same order, so the keys agree.
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
            if self.steps_per_execution > 1 and _compat.is_multi_worker(self.distribute_strategy):
                with _compat.collective_keys_at_trace_time():
                    return function(iterator)
            return function(iterator)

        return run

    _make_function.tfdist_executions = True
    return _make_function
