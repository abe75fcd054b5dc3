"""Train and eval steps for any compiled Keras model: its own loss and metrics, under every strategy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.errors import UserError
from tfdist import _compat


class KerasSteps:
    """The replica functions of a compiled Keras model.

    Args:
      model: a Keras model compiled with a loss (and optionally metrics), built under the strategy's scope.
      optimizer: its optimizer (``model.optimizer``).
      sample: ``(x, y)`` or ``(x, y, sample_weight)`` of a few examples, to build the compiled loss and
        metrics outside any step.
    """

    #: The count in ``metrics``' result (throughput is examples per second).
    count_key = "examples"

    def __init__(self, *, model, optimizer, sample):
        if _compat.compiled_loss(model) is None:
            raise UserError(
                "Missing loss: model_fn must return a model compiled with a loss. Received: a model without "
                "one. Expected model.compile(optimizer=..., loss=..., metrics=[...]) inside model_fn."
            )
        self.model = model
        self.optimizer = optimizer
        x, y = sample[:2]
        y_pred = model(x, training=False)
        compile_loss = _compat.compiled_loss(model)
        if not compile_loss.built:  # built here, not inside a step: it may make loss trackers
            compile_loss.build(y, y_pred)
        _check_reductions(compile_loss)
        compiled = _compat.compiled_metrics(model)
        if compiled is not None and not compiled.built:
            compiled.build(y, y_pred)
        if compiled is not None:
            # A metric that creates its variables at its first update (F1Score, FBetaScore: from y_true's
            # shape) makes them here, under the model's strategy, before they are read; reset below.
            with model.distribute_strategy.scope():
                compiled.update_state(y, y_pred)
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
        self.jit_compile = bool(model.jit_compile)  # Keras' own reading of compile(jit_compile=...), "auto" resolved
        if self.jit_compile:
            refuse_unsupported_xla(model)
        self._gradients = (tf.function(self._forward_backward, jit_compile=True) if self.jit_compile
                           else self._forward_backward)
        self._initial = [np.asarray(v.numpy()) for v in variables]
        self._shapes = [v.shape for v in self._initial]
        self._dtypes = [v.dtype for v in variables]
        self._sizes = [int(np.prod(shape)) for shape in self._shapes]

    @property
    def stats_size(self) -> int:
        return 2 + sum(self._sizes)

    def _objective(self, x, y, sample_weight, p, training: bool):
        """Predictions, this replica's ``n/p * (mean loss + regularization)`` and its ``loss_sum``."""
        y_pred = self.model(x, training=training)
        n = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
        mean = tf.cast(_compat.compiled_loss(self.model)(y, y_pred, sample_weight), tf.float32)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:  # Keras divides a loss inside a replica by the replicas (scale_loss_for_distribution)
            mean = mean * replicas
        regularization = tf.add_n([tf.cast(tf.reduce_sum(l), tf.float32) for l in self.model.losses]) \
            if self.model.losses else tf.constant(0.0)
        loss_sum = tf.where(n > 0, n * (mean + regularization), 0.0)
        return y_pred, loss_sum / tf.cast(p, tf.float32), loss_sum, n

    def _stats(self, y, y_pred, sample_weight, loss_sum, n):
        head = tf.stack([loss_sum, n])
        if self._compiled is None:
            return head
        initial = [tf.constant(v) for v in self._initial]
        updated = self._compiled.stateless_update_state(initial, y, y_pred, sample_weight)
        deltas = [tf.reshape(tf.cast(new, tf.float32) - tf.cast(old, tf.float32), [-1])
                  for new, old in zip(updated, initial)]
        return tf.concat([head, *deltas], axis=0)

    def _forward_backward(self, x, y, sample_weight, p):
        """This replica's gradients, predictions, ``loss_sum`` and examples (compiled with XLA on ``jit_compile``)."""
        with tf.GradientTape() as tape:
            y_pred, objective, loss_sum, n = self._objective(x, y, sample_weight, p, training=True)
            scaled = self.optimizer.scale_loss(objective)
        return tape.gradient(scaled, self.model.trainable_variables), y_pred, loss_sum, n

    def train(self, batch):
        """One optimisation step on this replica's slice; returns its stats vector.

        The gradients go to the optimizer, which sums them over replicas before it clips, accumulates or
        applies them (``fitting.global_gradients``): the all-reduce stays outside the XLA-compiled part.
        """
        x, y, sample_weight, p = _unpack(batch)
        grads, y_pred, loss_sum, n = self._gradients(x, y, sample_weight, p)
        self.optimizer.apply(grads, self.model.trainable_variables)
        return self._stats(y, y_pred, sample_weight, loss_sum, n)

    def evaluate(self, batch):
        """Forward pass in inference mode on this replica's slice; returns its stats vector."""
        x, y, sample_weight, p = _unpack(batch)
        y_pred, _, loss_sum, n = self._objective(x, y, sample_weight, p, training=False)
        return self._stats(y, y_pred, sample_weight, loss_sum, n)

    def metrics(self, stats) -> dict[str, float]:
        """``{"loss", <each compiled metric>, "examples"}`` of a summed stats vector, as Keras names them."""
        stats = np.asarray(stats, dtype=np.float64)
        result = {"loss": float(stats[0] / stats[1]) if stats[1] else float("nan")}
        if self._compiled is not None:
            values, offset = [], 2
            for initial, shape, dtype, size in zip(self._initial, self._shapes, self._dtypes, self._sizes):
                total = initial.astype(np.float64) + stats[offset:offset + size].reshape(shape)
                values.append(tf.constant(total.astype(dtype)))
                offset += size
            for name, value in self._compiled.stateless_result(values).items():
                result[name] = float(np.asarray(value))
        result["examples"] = int(stats[1])
        return result

    @staticmethod
    def describe(split: str, result: dict) -> str:
        """Every metric of a result, as Keras prints them: ``loss 0.1234  accuracy 0.9000``."""
        return "  ".join(f"{k} {v:.4f}" for k, v in result.items() if k not in ("examples", "examples_per_second",
                                                                               "learning_rate"))


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


def refuse_unsupported_xla(model) -> None:
    """Refuse ``jit_compile=True`` where XLA cannot compile one replica's step (one line, status 2).

    The gradients' all-reduce stays outside the compiled part, but batch norm with ``synchronized=True``
    all-reduces its statistics inside the forward pass (XLA has no collectives for CPU devices), and
    ``central_storage`` and the parameter servers keep the variables on one device while XLA compiles each
    replica's step on its own.
    """
    import keras

    strategy = model.distribute_strategy
    replicas = strategy.num_replicas_in_sync
    elsewhere = {tf.distribute.experimental.CentralStorageStrategy: ("central_storage", replicas > 1),
                 tf.distribute.experimental.ParameterServerStrategy: ("parameter_server", True)}
    for kind, (name, refused) in elsewhere.items():
        if isinstance(strategy, kind) and refused:
            raise UserError(
                f"Invalid compile(jit_compile=True) under {name}: XLA compiles each replica's step on its own "
                "device and cannot read variables kept on another. Received: jit_compile=True. Expected "
                "jit_compile=False, or strategy='mirrored' or 'multi_worker_mirrored', which keep a copy of the "
                "variables on every device."
            )
    synchronized = [layer.name for layer in _compat.sublayers(model)
                    if isinstance(layer, keras.layers.BatchNormalization) and layer.synchronized]
    if replicas > 1 and synchronized and not tf.config.list_logical_devices("GPU"):
        raise UserError(
            f"Invalid compile(jit_compile=True) for {replicas} replicas on CPU: {', '.join(synchronized)} "
            "synchronizes batch statistics across replicas inside the step, and XLA has no collectives for CPU "
            "devices. Received: jit_compile=True with BatchNormalization(synchronized=True). Expected "
            "jit_compile=False on CPU, or one replica."
        )
