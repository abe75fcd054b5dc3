"""Train and eval steps for any compiled Keras model: its own loss and metrics, under every strategy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.errors import UserError
from tfdist.one_device.empty_slices import skipping_convolutions
from tfdist.one_device.symbolic import keras_tensors
from tfdist.one_device import xla
from tfdist import _compat


class KerasSteps:
    """The replica functions of a compiled Keras model.

    Args:
      model: a Keras model compiled with a loss (and optionally metrics), built under the strategy's scope.
      optimizer: its optimizer (``model.optimizer``).
      spec: the type of a global batch ``(x, y[, sample_weight])`` (``inputs.Source.spec``), to build the
        compiled loss and metrics outside any step, symbolically (a user's Dataset is not read before training).
      rows: numpy ``(x, y)`` of a few examples (``inputs.Source.first_rows``), to build them on instead.
    """

    #: The count in ``metrics``' result (throughput is examples per second).
    count_key = "examples"

    def __init__(self, *, model, optimizer, spec, rows=None):
        if _compat.compiled_loss(model) is None:
            raise UserError(
                "Missing loss: model_fn must return a model compiled with a loss. Received: a model without "
                "one. Expected model.compile(optimizer=..., loss=..., metrics=[...]) inside model_fn."
            )
        self.model = model
        self.optimizer = optimizer
        compile_loss, compiled = _compat.compiled_loss(model), _compat.compiled_metrics(model)
        # Built here, not inside a step, and under the model's strategy as Keras' fit builds them (its symbolic
        # build, which also makes the variables a metric creates at its first update: F1Score, FBetaScore): the
        # loss trackers and metrics are the strategy's variables, which Keras' own evaluate of the model updates.
        if rows is None:
            _compat.symbolic_build(model, keras_tensors(spec))
        else:
            x, y = rows
            with model.distribute_strategy.scope():
                y_pred = model(x, training=False)
                y = _targets_as_keras_packs(y, y_pred)
                if not compile_loss.built:
                    compile_loss.build(y, y_pred)
                if compiled is not None and not compiled.built:
                    compiled.build(y, y_pred)
                if compiled is not None:  # a metric that makes its variables at its first update; reset below
                    compiled.update_state(y, y_pred)
        _check_reductions(compile_loss)
        self._compiled = compiled
        variables = list(compiled.variables) if compiled is not None else []
        for variable in variables:
            if getattr(variable, "aggregation", "sum") != "sum":
                raise UserError(
                    f"Invalid metric for tfdist.fit: {variable.path} aggregates with {variable.aggregation!r}. "
                    "Received a metric whose state does not add up over replicas. Expected metrics whose "
                    "variables have aggregation='sum' (Keras' means, accuracies, AUC, precision, recall)."
                )
        if compiled is not None:
            compiled.reset_state()
        # Keras' own reading of compile(jit_compile=...), "auto" resolved; off where XLA cannot compile the step.
        self.jit_compile = bool(model.jit_compile) and xla_compiles(model)
        self._gradients = (tf.function(self._forward_backward, jit_compile=True) if self.jit_compile
                           else self._forward_backward)
        self._initial = [np.asarray(v.numpy()) for v in variables]
        self._shapes = [v.shape for v in self._initial]
        self._dtypes = [v.dtype for v in variables]
        self._sizes = [int(np.prod(shape)) for shape in self._shapes]
        self._trackers = _compat.loss_trackers(compile_loss)
        # [loss_sum, examples], then with per-output losses: [batches, each output's batch mean].
        self._head = 2 + (1 + len(self._trackers) if self._trackers else 0)

    @property
    def stats_size(self) -> int:
        return self._head + sum(self._sizes)

    def _compiled_loss(self, y, y_pred, sample_weight):
        """The compiled loss of this replica's slice as Keras' step computes it, and each output's loss.

        Keras' per-output loss trackers (a ``Mean`` per output when there are several) see each output's
        unweighted mean loss over the replica's examples; their update runs in a ``StatelessScope``, so that
        the trackers' variables stay as they are and the update is read back as that mean.
        """
        import keras

        compile_loss = _compat.compiled_loss(self.model)
        mapping = [(v, tf.zeros(v.shape, v.dtype)) for tracker in self._trackers for v in tracker.variables]
        with keras.StatelessScope(state_mapping=mapping) as scope:
            total = compile_loss(y, y_pred, sample_weight)
        outputs = [tracker.stateless_result([scope.get_current_value(v) for v in tracker.variables])
                   for tracker in self._trackers]
        return tf.cast(total, tf.float32), [tf.cast(value, tf.float32) for value in outputs]

    def _objective(self, x, y, sample_weight, p, training: bool):
        """Predictions, this replica's ``n/p * (mean loss + regularization)`` and the head of its stats vector.

        The head is ``[loss_sum, n]``, and with per-output losses ``[n/p, n/p * each output's mean]``: summed
        over the replicas, one per step and the global batch's mean of each output, which Keras' trackers
        average over the steps alike (one device weighs each step's mean as one, whatever its examples).
        """
        y_pred = self.model(x, training=training)
        n = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
        share = n / tf.cast(p, tf.float32)
        mean, outputs = self._compiled_loss(y, y_pred, sample_weight)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:  # Keras divides a loss inside a replica by the replicas (scale_loss_for_distribution)
            mean = mean * replicas
        regularization = tf.add_n([tf.cast(tf.reduce_sum(l), tf.float32) for l in self.model.losses]) \
            if self.model.losses else tf.constant(0.0)
        loss_sum = tf.where(n > 0, n * (mean + regularization), 0.0)
        head = [loss_sum, n] + ([share] + [tf.where(n > 0, share * value, 0.0) for value in outputs]
                                if outputs else [])
        return y_pred, loss_sum / tf.cast(p, tf.float32), tf.stack(head)

    def _stats(self, y, y_pred, sample_weight, head):
        if self._compiled is None:
            return head
        initial = [tf.constant(v) for v in self._initial]
        updated = self._compiled.stateless_update_state(initial, y, y_pred, sample_weight)
        deltas = [tf.reshape(tf.cast(new, tf.float32) - tf.cast(old, tf.float32), [-1])
                  for new, old in zip(updated, initial)]
        return tf.concat([head, *deltas], axis=0)

    def _forward_backward(self, x, y, sample_weight, p):
        """This replica's gradients, predictions and stats head (compiled with XLA on ``jit_compile``)."""
        with tf.GradientTape() as tape:
            y_pred, objective, head = self._objective(x, y, sample_weight, p, training=True)
            scaled = self.optimizer.scale_loss(objective)
        return tape.gradient(scaled, self.model.trainable_variables), y_pred, head

    def train(self, batch):
        """One optimisation step on this replica's slice; returns its stats vector.

        The gradients go to the optimizer, which sums them over replicas before it clips, accumulates or
        applies them (``one_device.optimizer``): the all-reduce stays outside the XLA-compiled part.
        """
        x, y, sample_weight, p = _unpack(batch)
        with skipping_convolutions(self.model):  # a replica with no rows (oneDNN mis-shapes an empty batch)
            grads, y_pred, head = self._gradients(x, y, sample_weight, p)
        self.optimizer.apply(grads, self.model.trainable_variables)
        return self._stats(y, y_pred, sample_weight, head)

    def evaluate(self, batch):
        """Forward pass in inference mode on this replica's slice; returns its stats vector."""
        x, y, sample_weight, p = _unpack(batch)
        with skipping_convolutions(self.model):
            y_pred, _, head = self._objective(x, y, sample_weight, p, training=False)
        return self._stats(y, y_pred, sample_weight, head)

    def metrics(self, stats) -> dict:
        """``{"loss", <each compiled metric>, <each output's loss>, "examples"}`` of a summed stats vector, as
        Keras names them and holds them in its logs (``log_value``)."""
        stats = np.asarray(stats, dtype=np.float64)
        result = {"loss": float(stats[0] / stats[1]) if stats[1] else float("nan")}
        if self._compiled is not None:
            values, offset = [], self._head
            for initial, shape, dtype, size in zip(self._initial, self._shapes, self._dtypes, self._sizes):
                total = initial.astype(np.float64) + stats[offset:offset + size].reshape(shape)
                values.append(tf.constant(total.astype(dtype)))
                offset += size
            for name, value in self._compiled.stateless_result(values).items():
                result[name] = log_value(value)
        batches = stats[2] if self._trackers else 0.0
        for i, tracker in enumerate(self._trackers):
            result[tracker.name] = float(stats[3 + i] / batches) if batches else float("nan")
        result["examples"] = int(stats[1])
        return result

    @staticmethod
    def describe(split: str, result: dict) -> str:
        return describe(result)


def log_value(value):
    """A metric's result as Keras' logs hold it (``pythonify_logs``): a float, or a numpy array of the metric's
    dtype for a result of several values (``F1Score(average=None)``: one value per class)."""
    array = np.asarray(value)
    return float(array.reshape(-1)[0]) if array.size == 1 else array


def describe(result: dict) -> str:
    """Every metric of a result, as Keras prints them: ``loss 0.1234  f1_score [0.5000 0.2500]``."""
    def text(value) -> str:
        if isinstance(value, np.ndarray):
            return "[" + " ".join(f"{v:.4f}" for v in value.ravel()) + "]"
        return f"{value:.4f}"

    return "  ".join(f"{k} {text(v)}" for k, v in result.items()
                     if isinstance(v, (float, np.ndarray)) and k not in ("examples_per_second", "learning_rate"))


def _unpack(batch):
    """``(x, y, sample_weight or None, p)`` of a batch ``(x, y, p)`` or ``(x, y, sample_weight, p)``."""
    if len(batch) == 4:
        return batch
    x, y, p = batch
    return x, y, None, p


#: Loss reductions whose replica losses add up to the global batch's: ``sum(w * l) / n`` on each replica.
ADDITIVE_REDUCTIONS = ("sum_over_batch_size", "mean")


def _check_reductions(compile_loss) -> None:
    """Refuse a compiled loss whose reduction is not linear in per-example sums (one line, status 2)."""
    for entry in _compat.flat_losses(compile_loss):
        reduction = getattr(entry.loss, "reduction", "sum_over_batch_size")
        if reduction not in ADDITIVE_REDUCTIONS:
            raise UserError(
                f"Invalid loss reduction for tfdist.fit: {getattr(entry.loss, 'name', entry.loss)!r} reduces with "
                f"{reduction!r}. Received a reduction whose replica results do not add up to the global batch's. "
                "Expected Keras' default reduction='sum_over_batch_size'."
            )


def xla_compiles(model) -> bool:
    """Whether XLA can compile one replica's forward and backward pass (``one_device.xla``); where it cannot, it
    runs without XLA, said once.

    The gradients' all-reduce stays outside the compiled part, but batch norm with ``synchronized=True``
    all-reduces its statistics inside the forward pass, and ``central_storage`` and the parameter servers keep
    the variables on another device than the step's.
    """
    import keras

    synchronized = [layer.name for layer in _compat.sublayers(model)
                    if isinstance(layer, keras.layers.BatchNormalization) and layer.synchronized]
    return xla.compiles(model, "the forward and backward pass",
                        all_reduces=f"the batch statistics of {', '.join(synchronized)}" if synchronized else None)


def _targets_as_keras_packs(y, y_pred):
    """Targets packed as Keras' ``CompileLoss`` packs them before it builds on them: one model output's targets
    given as a list (or tuple) of one array are that array, as in Keras' own ``fit``."""
    import keras

    if not keras.tree.is_nested(y_pred) and keras.tree.is_nested(y) and len(keras.tree.flatten(y)) == 1:
        return keras.tree.flatten(y)[0]
    return y
