"""``tfdist.fit``'s inputs: numpy arrays, a ``tf.data.Dataset``, a ``keras.utils.PyDataset``, a Python generator or
a ``dataset_fn``, each a ``Source`` whose kind is decided once, in Keras' order, and cut into per-replica slices."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.errors import UserError
from tfdist.fitting import keras_data
from tfdist.engine.inputs import batches_per_step


def _cut(context, batch_size: int):
    """A flat_map fn: a global batch ``(x, y[, sample_weight])``, or ``x`` alone -> this pipeline's replicas'
    slices ``(x, y[, sample_weight], p)`` or ``(x, p)``.

    Each replica takes a ``ceil(p / R)`` share of a batch of ``p`` examples, in replica order: a full batch
    splits evenly, and a last, shorter one as Keras splits it (25 examples over 2 replicas: 13 and 12), so no
    replica holds an empty slice while another holds more than its share.
    """
    replicas = context.num_replicas_in_sync
    local = batches_per_step(context)
    first = context.input_pipeline_id * local

    def cut(*parts):
        p = tf.shape(tf.nest.flatten(parts[0])[0])[0]
        per_replica = (p + replicas - 1) // replicas

        def piece(j):
            start = tf.minimum(tf.cast(first + j, tf.int32) * per_replica, p)
            stop = tf.minimum(start + per_replica, p)
            take = lambda t: t[start:stop]  # noqa: E731
            return (*tf.nest.map_structure(take, parts), p)

        return tf.data.Dataset.range(local).map(piece)

    return cut


def class_weights_map(class_weight: dict):
    """A map fn over batches ``(x, y)`` -> ``(x, y, sample_weight)`` with Keras' class weights.

    A row's class is its integer target, or the argmax of a one-hot row (as Keras' ``fit`` reads them); an
    unlisted class weighs 1.0.
    """
    listed = max(class_weight) + 1
    table = tf.constant([float(class_weight.get(c, 1.0)) for c in range(listed)] + [1.0], tf.float32)

    def weigh(x, y):
        labels = tf.convert_to_tensor(y)
        if labels.shape.rank >= 2:
            one_hot = lambda: tf.argmax(labels, axis=-1, output_type=tf.int32)  # noqa: E731
            column = lambda: tf.cast(tf.round(tf.squeeze(labels, axis=-1)), tf.int32)  # noqa: E731
            width = labels.shape[-1]  # where it is known, only the branch that fits it can be built
            labels = tf.cond(tf.shape(labels)[-1] > 1, one_hot, column) if width is None else (
                one_hot() if width > 1 else column())
        else:
            labels = tf.cast(tf.round(labels), tf.int32)
        index = tf.where((labels < 0) | (labels >= listed), listed, labels)  # unlisted classes weigh 1.0
        return x, y, tf.gather(table, index)

    return weigh


def check_batch(batch_size, replicas: int) -> None:
    """Refuse a global batch that does not split evenly over the replicas (one line, status 2)."""
    if not isinstance(batch_size, int) or batch_size < 1 or batch_size % replicas:
        raise UserError(
            f"Invalid value for `batch_size`. Received: batch_size={batch_size!r} with {replicas} replicas. "
            "Expected the global batch: a positive multiple of the number of replicas."
        )


#: The kinds of an input (``Source.kind``), as Keras' data adapters tell them apart.
ARRAYS, DATASET, DATASET_FN, PY_DATASET, GENERATOR = "arrays", "dataset", "dataset_fn", "PyDataset", "generator"
#: The kinds whose batches Keras' own data adapter reads (``Source.keras_batches``).
KERAS_READ = (PY_DATASET, GENERATOR)

#: Keras' batch for numpy data when no ``batch_size`` is given (its data adapters' default).
DEFAULT_BATCH_SIZE = 32


@dataclasses.dataclass(frozen=True)
class Source:
    """One input of ``tfdist.fit`` (``x`` with its ``y`` and ``sample_weight``, or the validation data), its kind
    decided once (``Source.of``, where ``fit``'s arguments are checked), as Keras' ``get_data_adapter`` decides
    it: what follows asks the Source, never the value again.

    ``kind``: ``ARRAYS``, numpy arrays (or nested structures of them) with ``y`` and ``sample_weight`` beside
    them (or none); ``DATASET``, a ``tf.data.Dataset`` of ``(x, y)`` or ``(x, y, sample_weight)`` global
    batches, or of ``x`` alone; ``DATASET_FN``, a callable ``dataset_fn(InputContext)`` returning a pipeline's
    per-replica batches; ``PY_DATASET`` and ``GENERATOR``, a ``keras.utils.PyDataset`` or a Python generator of
    global batches, which become a ``DATASET`` once the process is set up (``keras_batches``). A dataset's ``y``
    and ``sample_weight`` are in its elements (None here).
    """

    kind: str
    x: Any
    y: Any = None
    sample_weight: Any = None
    #: Keras' own data adapter made these batches (``keras_batches``): weighed by ``class_weight`` already, and
    #: drawing state (Python's ``random``, a PyDataset's hooks) as each epoch starts, so a training stream ends
    #: at the run's last step rather than start an epoch no step reads.
    read_by_keras: bool = False

    @classmethod
    def of(cls, x, y=None, sample_weight=None) -> Source:
        """The Source of ``x`` (with its ``y`` and ``sample_weight``): what is not a dataset is arrays."""
        import keras

        kind = (DATASET if isinstance(x, tf.data.Dataset) else PY_DATASET if isinstance(x, keras.utils.PyDataset)
                else GENERATOR if isinstance(x, types.GeneratorType) else DATASET_FN if callable(x) else ARRAYS)
        return cls(kind, x, y, sample_weight)

    @property
    def is_arrays(self) -> bool:
        """Numpy arrays, cut into batches by ``batch_size``; else a dataset, which yields its own ``y``."""
        return self.kind == ARRAYS

    @property
    def is_dataset(self) -> bool:
        """A ``tf.data.Dataset``: its batches are the user's global batches (no ``batch_size`` needed)."""
        return self.kind == DATASET

    @property
    def own_batches(self) -> bool:
        """An input of its own global batches (a Dataset, a PyDataset or a generator): ``batch_size`` is not
        needed, and Keras' ``fit`` ignores it."""
        return self.kind in (DATASET, *KERAS_READ)

    def keras_batches(self, *, shuffle=False, class_weight=None, steps_per_epoch=None,
                      evaluation: bool = False) -> Source:
        """This input once the process is set up: a PyDataset or a generator as the ``DATASET`` of the global
        batches that Keras' own data adapter makes of it (``keras_data.adapted``); any other input as it is."""
        if self.kind not in KERAS_READ:
            return self
        from tfdist.fitting.keras_data import adapted

        dataset = adapted(self.x, generator=self.kind == GENERATOR, shuffle=shuffle, class_weight=class_weight,
                          steps_per_epoch=steps_per_epoch, evaluation=evaluation)
        return Source(DATASET, dataset, read_by_keras=True)

    def unknown_length(self) -> bool:
        """Whether an epoch cannot count its batches: a dataset_fn, or a Dataset that repeats, is empty or whose
        length TensorFlow does not know."""
        if self.is_dataset:
            return _cardinality(self.x) is None
        if self.kind == PY_DATASET:
            return not self.x.num_batches
        return self.kind == DATASET_FN

    def rows_and_steps(self, batch_size) -> tuple[int | None, int | None]:
        """``(rows, steps per epoch)`` of arrays, or ``(None, batches)`` of a Dataset (None when TensorFlow does
        not know); ``(None, None)`` for a ``dataset_fn``. Builds no dataset.

        The forms and row counts of ``x``/``y``/``sample_weight`` are ``args.check_fit_args``' to check
        (before the process is set up); here every array has as many rows as ``x``'s first.
        """
        if self.kind in (DATASET_FN, GENERATOR):
            return None, None
        if self.kind == PY_DATASET:
            return None, self.x.num_batches or None
        if self.is_dataset:
            return None, _cardinality(self.x)
        rows = len(tf.nest.flatten(self.x)[0])
        return rows, math.ceil(rows / batch_size)

    def split(self, at: int) -> tuple[Source, Source]:
        """``(its first at rows, the others)`` of arrays: Keras' ``validation_split`` validates on the last rows
        (``args.training_rows`` counts the first); a missing ``sample_weight`` stays None."""
        arrays = (self.x, self.y, self.sample_weight)
        rows = next(len(a) for a in tf.nest.flatten(arrays) if a is not None)

        def cut(begin: int, end: int) -> Source:
            return Source(ARRAYS, *tf.nest.map_structure(lambda a: None if a is None else a[begin:end], arrays))

        return cut(0, at), cut(at, rows)

    def spec(self):
        """The type of one global batch as the model's steps receive it, read without iterating the input (a
        Dataset's ``element_spec``; arrays' shapes, rows unknown; a dataset_fn's with a default ``InputContext``):
        ``(x, y)`` or ``(x, y, sample_weight)``, or ``x`` alone where there are no targets (numpy ``x`` without
        ``y``, a Dataset of single tensors or dicts), as Keras' ``fit`` hands a step its ``data``."""
        if self.is_arrays:
            def of(array):
                array = np.asarray(array)
                dtype = tf.string if array.dtype.kind in "OUS" else tf.as_dtype(array.dtype)
                return tf.TensorSpec((None, *array.shape[1:]), dtype)

            parts = tuple(part for part in (self.x, self.y, self.sample_weight) if part is not None)
            specs = tf.nest.map_structure(of, parts)
            return specs if len(specs) > 1 else specs[0]
        dataset = self.x if self.is_dataset else self.x(tf.distribute.InputContext())
        return dataset.element_spec

    def first_rows(self):
        """The first two rows of numpy ``x`` and ``y`` (``y`` None without), to check the model and its loss on
        values (a dtype or shape only a call refuses); None for a dataset, which is not read before training."""
        if not self.is_arrays:
            return None
        first = lambda a: None if a is None else np.asarray(a)[:2]  # noqa: E731
        return tf.nest.map_structure(first, self.x), tf.nest.map_structure(first, self.y)

    def dataset_fns(self, *, batch_size, shuffle: bool, seed: int, training: bool, start_step: int = 0,
                    class_weight: dict | None = None, own_order_per_worker: bool = False, stage_dir=None,
                    total_steps: int | None = None, steps_per_epoch: int | None = None):
        """``(InputContext -> Dataset of (x, y[, sample_weight], p)``, steps per epoch or None) of this input.

        Args:
          batch_size: the global batch (None: a Dataset's own batches).
          shuffle: Keras' ``shuffle`` of numpy rows (``True`` or ``"batch"``), in Keras' order (``keras_data.order``);
            never for eval.
          seed: the shuffle's seed where TensorFlow's global seed is not set, the same on every worker.
          training: repeat (the loop counts steps); eval passes are finite.
          start_step: the step a resumed run starts at: the global batches of the steps before are skipped, so
            it sees the examples an uninterrupted run would.
          class_weight: ``{class: weight}``, turned into sample weights as Keras does.
          own_order_per_worker: under a coordinator, each worker shuffles in its own order.
          stage_dir: under a coordinator, where the chief saves numpy rows or a Dataset (``Dataset.save``) for
            the workers to load: a dataset function sent to a remote worker cannot carry its data as constants
            (gRPC refuses messages over 4 MB: "Unable to parse tensor proto"). On storage every task shares.
          total_steps: the global step the run trains to: with ``stage_dir``, of a Dataset that repeats without
            end, or whose length TensorFlow does not know, only that many batches are staged (``_source``).
          steps_per_epoch: ``fit``'s; without it, a user's Dataset of known length is repeated in Keras' epochs
            up to ``total_steps`` (``keras_epochs``).
        """
        weigh = class_weights_map(class_weight) if class_weight and not self.read_by_keras else None
        if self.kind == DATASET_FN:
            def from_fn(context):
                ds = self.x(context)
                ds = (ds.map(weigh) if weigh else ds).map(lambda *parts: (*parts, batch_size))
                return ds.repeat().skip(start_step * batches_per_step(context)) if training else ds

            return from_fn, None
        rows, steps = self.rows_and_steps(batch_size)
        order = keras_data.order(rows, batch_size, shuffle, seed) if rows is not None and shuffle and training else None
        source = _source(self.x if self.is_dataset else self._rows_dataset(order), stage_dir, rows=rows,
                         total_steps=total_steps)

        def fn(context):
            batches = source()  # made inside the function: a coordinator's workers make their own
            if rows is not None:
                batches = batches.batch(batch_size)
            if weigh:
                batches = batches.map(weigh)
            if training:
                as_keras = (self.is_dataset and not self.read_by_keras and steps is not None and steps_per_epoch is None
                            and stage_dir is None)  # a staged Dataset is one order, saved
                if as_keras:  # the epochs to the run's last step: no iterator is made past it
                    batches = keras_epochs(batches, None if total_steps is None else math.ceil(total_steps / steps))
                else:
                    batches = batches.repeat()
                batches = batches.skip(start_step)
                if self.read_by_keras and total_steps is not None and not own_order_per_worker:
                    batches = batches.take(total_steps - start_step)
            return batches.flat_map(_cut(context, batch_size))

        if own_order_per_worker and training:
            from tfdist.engine.inputs import per_worker_order

            return per_worker_order(fn, seed=seed), steps
        return fn, steps

    def eval_dataset_fn(self, *, batch_size, validation_steps, seed):
        """The eval pipeline of this validation input, cut to ``validation_steps`` global steps (None: all).

        Where a Dataset's own batches train (no ``batch_size``), numpy validation data goes in Keras' default
        batches of 32, each cut over the replicas as a Dataset's own batch is.
        """
        source = self
        if batch_size is None and self.is_arrays:
            source = Source(DATASET, self._rows_dataset().batch(DEFAULT_BATCH_SIZE))
        eval_fn, _ = source.dataset_fns(batch_size=batch_size, shuffle=False, seed=seed, training=False)
        if not validation_steps:
            return eval_fn
        return lambda context: eval_fn(context).take(validation_steps * batches_per_step(context))

    def _rows_dataset(self, order=None):
        """The arrays' rows as a Dataset of ``(x, y[, sample_weight])`` examples, or of ``x``'s alone without ``y``,
        in ``order`` (None: as given).

        A list of arrays (or of tensors) is a structure of inputs, as Keras reads it (its lists become tuples),
        not one array to stack.
        """
        import keras

        if self.y is None:
            parts = self.x
        else:
            parts = (self.x, self.y) if self.sample_weight is None else (self.x, self.y, self.sample_weight)
        parts = keras.tree.lists_to_tuples(parts)
        if order is not None:
            parts = tf.nest.map_structure(lambda a: np.asarray(a)[order], parts)
        return tf.data.Dataset.from_tensor_slices(parts)


#: Numpy rows staged as one element.
STAGED_ROWS = 1024
#: What to pass instead of an input too large to stage.
STAGE_INSTEAD = ("fewer epochs or steps_per_epoch, or x as a dataset_fn (a function of a "
                 "tf.distribute.InputContext that returns the Dataset), which each worker calls to build its own")


def keras_epochs(dataset, epochs: int | None = None):
    """``dataset`` repeated ``epochs`` times (None: without end) as Keras' ``fit`` reads a Dataset of known length
    without ``steps_per_epoch``: each epoch from an iterator of its own, and one more made and left unread as
    the epoch ends (Keras' epoch iterator makes one then, and a new one as the next epoch begins).

    An iterator draws the seeds of a ``shuffle(..., reshuffle_each_iteration=True)`` as it is made, so that
    Keras' epoch k sees the Dataset's order 2k-1, and after ``epochs`` the Dataset has drawn 2 * ``epochs``
    orders, as after Keras' ``fit``. An epoch here is ``choose_from_datasets`` of the Dataset twice, always
    the first: it makes both iterators, in that order, and reads the first alone. The epochs follow each
    other by ``flat_map``, which makes no iterator after the last (``repeat`` makes one more).
    """
    first = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    epoch = tf.data.Dataset.choose_from_datasets([dataset, dataset], first)
    count = tf.data.Dataset.range(epochs) if epochs is not None else first
    return count.flat_map(lambda _: epoch)


def _source(dataset, stage_dir, *, rows: int | None, total_steps: int | None):
    """``() -> dataset``; with ``stage_dir``, the dataset is staged there now and each call loads it from the files.

    A finite dataset (numpy rows, or a Dataset of known length) is staged whole. Of a Dataset that repeats
    without end (``.repeat()`` with ``steps_per_epoch``), or whose length TensorFlow does not know
    (``.filter``, a generator), its first ``total_steps`` batches are staged: the batches one process trains
    on, each epoch going on where the last one ended (a shorter one is staged whole, and repeats as it
    would on one process). A stage whose size is known beforehand (numpy rows; a Dataset whose type has every
    shape known, its batches' too) and over the limit is refused before anything is written; any other is
    stopped at the limit (``staging.stage``). A user's Dataset is not read for the estimate.
    """
    if stage_dir is None:
        return lambda: dataset
    from tfdist.fitting import staging

    limit = staging.limit_bytes()
    count = rows if rows is not None else _cardinality(dataset)
    if rows is not None:
        what = f"the {rows} numpy rows of x"
    elif count is not None:
        what = f"the {count} batches of the Dataset x"
    else:
        infinite = int(dataset.cardinality().numpy()) == int(tf.data.INFINITE_CARDINALITY)
        what = f"the first {total_steps} batches of the Dataset x"
        sys.stderr.write(
            f"tfdist: the Dataset x {'repeats without end' if infinite else 'is of unknown length'}: "
            f"{'its' if infinite else 'at most its'} first {total_steps} batches, one for each step up to step "
            f"{total_steps} (each epoch going on where the last one ended), are staged for the workers\n")
        sys.stderr.flush()
        dataset = dataset.take(total_steps)
        count = total_steps if infinite else None
    # Of numpy rows, their first (tfdist's own dataset); of a Dataset, its element_spec: a user's Dataset is not
    # iterated before training (a Dataset that reshuffles each iteration would show epoch 1 its second order).
    each = staging.element_bytes(next(iter(dataset.take(1)))) if rows is not None else _spec_bytes(
        dataset.element_spec)
    if count and each is not None:
        estimate = each * count
        if estimate > limit:
            raise staging.refuse(what, f"would take about {staging.size_text(estimate)}", limit, STAGE_INSTEAD)
    staged = dataset if rows is None else dataset.batch(STAGED_ROWS)  # each element staged costs a Python call
    staging.stage(staged, stage_dir, what=what, instead=STAGE_INSTEAD, limit=limit)
    spec, path = staged.element_spec, str(stage_dir)
    if rows is None:
        return lambda: tf.data.Dataset.load(path, element_spec=spec)
    return lambda: tf.data.Dataset.load(path, element_spec=spec).unbatch()


def _spec_bytes(spec) -> int | None:
    """The bytes of one element of type ``spec``, or None where its shapes are not all known (or hold strings)."""
    total = 0
    for part in tf.nest.flatten(spec, expand_composites=True):
        shape, dtype = getattr(part, "shape", None), getattr(part, "dtype", None)
        if shape is None or dtype is None or not shape.is_fully_defined() or dtype == tf.string:
            return None
        total += shape.num_elements() * dtype.size
    return total


def _cardinality(dataset) -> int | None:
    """The batches of a finite dataset, or None when TensorFlow does not know (or it repeats)."""
    count = int(dataset.cardinality().numpy())
    return count if count > 0 else None
