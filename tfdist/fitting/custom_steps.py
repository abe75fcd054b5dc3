"""Train and eval steps for a Keras model that overrides ``train_step`` or ``test_step``: Keras' own calls."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.errors import UserError
from tfdist.one_device.empty_slices import skipping_convolutions
from tfdist.fitting.steps import describe, log_value
from tfdist.one_device.symbolic import has_call, keras_tensors
from tfdist.one_device.shares import replica_share
from tfdist.one_device import xla
from tfdist import _compat


def overrides_steps(model) -> list[str]:
    """The names of the steps ``model`` overrides (``train_step``, ``test_step``) against Keras' own."""
    import keras

    return [name for name in ("train_step", "test_step")
            if getattr(type(model), name) is not getattr(keras.Model, name)]


def refuse_under_coordinator(model, strategy_name: str) -> None:
    """Refuse a model with its own steps under a strategy with a coordinator (one line, status 2)."""
    names = overrides_steps(model)
    if names:
        raise UserError(
            f"Invalid model for tfdist.fit under strategy={strategy_name!r}: {type(model).__name__} overrides "
            f"{' and '.join(names)}. Received a model whose own steps tfdist.fit cannot run exactly there (its "
            "metrics would count a re-run step twice). Expected strategy='multi_worker_mirrored' or 'mirrored' "
            "for this model, or a model without the override (its compiled loss and metrics)."
        )


def _names(logs: dict) -> list[str]:
    """The names of a step's logs as Keras' callbacks see them: nested dicts flattened (``pythonify_logs``)."""
    names = set()
    for key, value in logs.items():
        names |= set(_names(value)) if isinstance(value, dict) else {key}
    return sorted(names)


def _sharing(step):
    """``step(data, examples, total)``: the model's ``step(data)`` with this replica's share of the step's examples
    known (one device's loss and gradients, on an uneven split too). The share comes in as arguments, so that a
    step compiled with XLA, traced once, reads the tensors of the call that runs it."""
    def run(data, examples, total):
        with replica_share(examples, total=total):
            return step(data)

    return run


class KerasModelSteps:
    """The replica functions of a model with its own ``train_step``/``test_step``.

    Args:
      model: a compiled Keras model, made under the strategy's scope (one without a ``call`` built from its
        ``train_step``: ``fitting.keras_model``).
      spec: the type of a global batch (``inputs.Source.spec``), to build a model with a ``call``, its compiled
        loss and metrics outside any step (Keras' symbolic build).
      takes_tuples: ``{"train_step": bool, "test_step": bool}``: whether the step's data is a tuple ``(x, y[,
        sample_weight])`` or ``x`` alone (numpy ``x`` without ``y``, a Dataset of single tensors), as Keras
        hands it.
    """

    #: The count in ``metrics``' result (throughput is examples per second).
    count_key = "examples"
    #: ``[0, examples]``: the figures are the metrics' own variables.
    stats_size = 2

    def __init__(self, *, model, spec, takes_tuples: dict[str, bool]):
        if not getattr(model, "compiled", False):
            raise UserError("Invalid model_fn: it must return a compiled keras.Model. Received: a "
                            f"{type(model).__name__} never compiled. Expected model.compile(optimizer=...) inside "
                            "model_fn.")
        self.model = model
        if has_call(model):
            _compat.symbolic_build(model, keras_tensors(spec))  # as Keras' fit builds it, under the strategy
        self._tuples = dict(takes_tuples)
        self._returned: dict[str, list[str]] = {}
        self._calls = {name: _sharing(getattr(model, name)) for name in ("train_step", "test_step")}
        # Keras' own reading of compile(jit_compile=...), "auto" resolved; its train_step all-reduces the gradients
        # inside the step (its optimizer.apply).
        if model.jit_compile and xla.compiles(model, f"{type(model).__name__}'s own train_step and test_step",
                                              all_reduces="the gradients"):
            self._calls = {name: tf.function(call, jit_compile=True) for name, call in self._calls.items()}

    def _run(self, name: str, batch):
        """``model.<name>(data)`` on this replica's slice (``data`` as Keras passes it); its stats vector."""
        *data, p = batch  # p: the step's examples over every replica
        n = tf.cast(tf.shape(tf.nest.flatten(data[0])[0])[0], tf.float32)
        with skipping_convolutions(self.model):  # a replica with no rows (oneDNN mis-shapes an empty batch)
            logs = self._calls[name](tuple(data) if self._tuples[name] else data[0], n, p)
        self._returned[name] = _names(logs) if isinstance(logs, dict) else [f"a {type(logs).__name__}"]
        return tf.stack([tf.constant(0.0), n])

    def train(self, batch):
        """``model.train_step`` on this replica's slice; returns ``[0, examples]``."""
        return self._run("train_step", batch)

    def evaluate(self, batch):
        """``model.test_step`` on this replica's slice; returns ``[0, examples]``."""
        return self._run("test_step", batch)

    def reset(self) -> None:
        """Reset the model's metrics: at each epoch's start and before each eval pass, as Keras' ``fit`` does."""
        self.model.reset_metrics()

    def metrics(self, stats) -> dict:
        """The model's metrics now (reduced over every replica and worker), and ``examples`` of ``stats``."""
        result = {}
        for name, value in self.model.get_metrics_result().items():
            result[name] = log_value(value)
        for step, keys in self._returned.items():
            if keys != sorted(result):
                raise UserError(
                    f"Invalid {step} for tfdist.fit: it returns {keys}, and model.metrics are named "
                    f"{sorted(result)}. Received logs that are not the model's metrics, which tfdist.fit reads "
                    "(reduced over every replica and worker) at each epoch's end. Expected "
                    f"{step} to return {{m.name: m.result() for m in self.metrics}}, with every tracker listed "
                    "in the model's `metrics` property."
                )
        result["examples"] = int(np.asarray(stats)[1])
        return result

    @staticmethod
    def describe(split: str, result: dict) -> str:
        return describe(result)


def check_own_logs(steps, strategy, train_fn) -> None:
    """Trace a model's own ``train_step`` once on the batches of ``train_fn`` (their ``element_spec``: nothing is
    read, and the trace runs nowhere) and check the logs it returns against the model's metrics, as
    ``steps.metrics`` checks them at each epoch's end, so that a step returning other logs is refused before the
    run directory's first write.

    Raises:
      UserError: the step returns logs other than the model's metrics (``steps.metrics``).
    """
    spec = train_fn(tf.distribute.InputContext()).element_spec
    tf.function(lambda batch: strategy.run(steps.train, args=(batch,))).get_concrete_function(spec)
    steps.metrics(np.zeros(2))
