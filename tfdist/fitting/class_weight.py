"""``tfdist.fit``'s ``class_weight``, checked and read as Keras' ``fit`` takes it: ``{class: weight}`` for a
single target, without sample weights."""

from __future__ import annotations

import math
import numbers

from tfdist.errors import UserError


#: Classes a ``class_weight`` may name: Keras' data adapters turn it into a table of ``max(class) + 1`` weights.
MAX_CLASSES = 2**24


def _class_index(key) -> int | None:
    """A ``class_weight`` key as the class it names (an int, a NumPy int, or a float of a whole number, which Keras'
    ``fit`` looks numpy labels up by), or None where it names none (a string, a negative or fractional number, one
    past ``MAX_CLASSES``)."""
    if isinstance(key, bool) or not isinstance(key, numbers.Real):
        return None
    if not isinstance(key, numbers.Integral) and not (math.isfinite(key) and float(key).is_integer()):
        return None
    return int(key) if 0 <= key < MAX_CLASSES else None


def keras_class_weight(class_weight):
    """``class_weight`` (checked) with each key the Python int of its class and each weight a Python float, as
    the table of weights is made of them; None as it is."""
    if class_weight is None:
        return None
    return {_class_index(k): float(v) for k, v in class_weight.items()} if isinstance(class_weight, dict) else \
        class_weight


def check_class_weight(class_weight, source) -> None:
    """``{class index: weight}``, for one target, without sample weights (as Keras' ``fit`` takes it)."""
    if not isinstance(class_weight, dict) or not class_weight or not all(
            _class_index(k) is not None and isinstance(v, numbers.Real) and not isinstance(v, bool)
            and 0 <= v < float("inf") for k, v in class_weight.items()):
        raise UserError(f"Invalid `class_weight`. Received: {class_weight!r:.80}. Expected a dict "
                        f"{{class index >= 0: finite weight >= 0}}, e.g. {{0: 1.0, 1: 5.0}}, its classes below "
                        f"{MAX_CLASSES}.")
    from tfdist.fitting.inputs import GENERATOR

    if source.kind == GENERATOR:
        raise UserError(f"Invalid `class_weight` with a Python generator `x`. Received: class_weight="
                        f"{class_weight!r:.60}. Expected the generator to yield (x, y, sample_weight) batches, as "
                        "Keras' fit takes them (it refuses class_weight with a generator).")
    x, y, dataset = source.x, source.y, source.is_dataset
    spec = x.element_spec if dataset else None
    if (y is None and source.is_arrays) or (dataset and not (isinstance(spec, tuple) and len(spec) >= 2)):
        raise UserError("Invalid `class_weight` without targets. Received: class_weight and inputs alone (no y). "
                        "Expected y (or a Dataset of (x, y) batches) whose classes the weights weigh.")
    if source.sample_weight is not None or (dataset and len(spec) == 3):
        raise UserError("Invalid `class_weight` with sample weights. Received: both. Expected one of "
                        "class_weight and sample_weight, as Keras' fit takes them.")
    import tensorflow as tf

    if (y is not None and len(tf.nest.flatten(y)) != 1) or (dataset and len(tf.nest.flatten(x.element_spec[1])) != 1):
        raise UserError("Invalid `class_weight` for several targets. Received: y with several outputs. "
                        "Expected class_weight for a model with a single output, as in Keras.")
