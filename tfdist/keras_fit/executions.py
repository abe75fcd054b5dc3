"""``compile(steps_per_execution=N)`` in Keras' own ``fit`` and ``evaluate`` over several replicas.

Across workers, Keras' loop of steps runs as Keras writes it, each collective keyed per execution. Over the
replicas of one process, TensorFlow cannot run Keras' loop (a ``MirroredStrategy.run`` in a ``tf.cond`` in a
``tf.while_loop`` fails: "You must feed a value for placeholder tensor"), so each execution runs its steps one
call at a time: up to N steps, fewer where the data ends, the last step's logs returned, as Keras' loop does.
"""

from __future__ import annotations

import functools

from tfdist import _compat


def install() -> None:
    """Wrap Keras' ``_make_function`` (train and test steps) once per process."""
    cls = _compat.keras_tensorflow_trainer().TensorFlowTrainer
    if getattr(cls._make_function, "tfdist_executions", False):
        return
    cls._make_function = _over_replicas(cls._make_function)


def _over_replicas(make_function):
    """``make_function`` whose function runs ``steps_per_execution > 1`` over several replicas: across workers
    Keras' loop with its collectives keyed at trace time, in one process ``_one_step_at_a_time``."""

    @functools.wraps(make_function)
    def _make_function(self, step_function):
        function = make_function(self, step_function)

        def run(iterator):
            if self.steps_per_execution == 1 or self.distribute_strategy.num_replicas_in_sync == 1:
                return function(iterator)
            if _compat.is_multi_worker(self.distribute_strategy):
                with _compat.collective_keys_at_trace_time():
                    return function(iterator)
            return _one_step_at_a_time(self, function, iterator)

        return run

    _make_function.tfdist_executions = True
    return _make_function


def _one_step_at_a_time(model, function, iterator):
    """One execution of ``model.steps_per_execution`` steps, each a call of Keras' function on one batch.

    The next batch is an ``Optional``, as in Keras' loop: where the data has run out (a distributed iterator's
    ``get_next`` would hand the replicas empty batches instead), the execution ends after the steps it ran.
    Keras' function runs a list of batches one step each, as it runs a Python iterator.
    """
    import tensorflow as tf

    if not isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
        return function(iterator)  # Keras' own step-by-step loop over a Python iterator
    outputs = None
    for _ in range(model.steps_per_execution):
        batch = iterator.get_next_as_optional()
        if not batch.has_value():
            break
        outputs = function([batch.get_value()])
    if outputs is None:
        raise StopIteration
    return outputs
