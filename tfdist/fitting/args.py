"""``tfdist.fit``'s arguments, checked before TensorFlow or the strategy is set up."""

from __future__ import annotations

import math
import numbers

from tfdist.config import MAX_STEPS, STRATEGIES, check_total_steps
from tfdist.errors import UserError, article, short
from tfdist.fitting.callback_args import check_callbacks
from tfdist.fitting.class_weight import check_class_weight


def _flat(value) -> list:
    import tensorflow as tf

    return tf.nest.flatten(value)


def _rows(name: str, value) -> set[int]:
    """The numbers of rows of the arrays in ``value`` (a nested structure); refuses what has no rows."""
    counts = set()
    for leaf in _flat(value):
        if leaf is None:  # no sample weights
            continue
        shape = getattr(leaf, "shape", None)
        if shape is None or len(shape) == 0:
            raise UserError(f"Invalid `{name}`. Received: a {type(leaf).__name__} with no rows. Expected numpy "
                            "arrays (or a nested structure of them) with one row per example.")
        counts.add(int(shape[0]))
    return counts


def keras_shuffle(shuffle):
    """``shuffle`` as Keras' ``fit`` reads it: None as False (Keras' adapters take any false value so), a NumPy bool
    as Python's; anything else as it is, for ``check_run_args`` to judge."""
    import numpy as np

    return False if shuffle is None else bool(shuffle) if isinstance(shuffle, np.bool_) else shuffle


def python_int(value):
    """A NumPy integer as Python's ``int``, as Keras' ``fit`` takes either; anything else as it is, for the checks
    to judge (a bool stays a bool)."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value


def check_positive_int(name: str, value, *, optional: bool = True) -> None:
    """Refuse anything but a positive int that TensorFlow's int64 holds (or None when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_STEPS:
        bound = " below 2**63" if isinstance(value, numbers.Integral) and value > MAX_STEPS else ""
        raise UserError(f"Invalid value for `{name}`. Received: {name}={value!r}. Expected "
                        f"{'None or ' if optional else ''}a positive integer{bound}.")


def _validation_source(validation_data):
    """The ``inputs.Source`` of ``validation_data`` as Keras' ``fit`` takes it (checked): a Dataset, or arrays."""
    from tfdist.fitting.inputs import Source

    whole = Source.of(validation_data)
    if whole.is_dataset:
        from tfdist.fitting.keras_data import check_dataset_elements

        check_dataset_elements("validation_data", validation_data)
        return whole
    if whole.own_batches:  # a PyDataset or a generator, read by Keras' own data adapter
        from tfdist.fitting.keras_data import check_py_dataset

        check_py_dataset("validation_data", validation_data)
        return whole
    if isinstance(validation_data, (tuple, list)) and len(validation_data) in (2, 3):
        x_val, y_val, *weights = validation_data
        sample_weight = weights[0] if weights else None
        if x_val is None or y_val is None:
            raise UserError(f"Invalid `validation_data`. Received: x_val={short(x_val, 40)}, y_val={short(y_val, 40)}. "
                            "Expected (x_val, y_val) numpy arrays, (x_val, y_val, sample_weight_val), or a "
                            "tf.data.Dataset of (x, y) global batches.")
        source = Source.of(x_val, y_val, sample_weight)
        if not source.is_arrays:
            raise UserError("Invalid `validation_data`. Received: a tuple holding a dataset. Expected (x_val, "
                            "y_val) numpy arrays, (x_val, y_val, sample_weight_val), or a tf.data.Dataset of "
                            "(x, y) global batches.")
        _check_dtypes("validation_data", (x_val, y_val))
        counts = _rows("validation_data", (x_val, y_val, sample_weight))
        if len(counts) != 1:
            raise UserError(f"Invalid `validation_data`: its arrays' numbers of rows differ. Received: "
                            f"{sorted(counts)}. Expected (x_val, y_val[, sample_weight_val]) with one row of "
                            "each per example.")
        _check_some_rows("validation_data", counts)
        _check_weights("validation_data", sample_weight, y_val)
        return source
    received = f"a {type(validation_data).__name__}" + (
        f" of {len(validation_data)}" if isinstance(validation_data, (tuple, list)) else
        f" of shape {tuple(validation_data.shape)}" if hasattr(validation_data, "shape") else "")
    raise UserError(f"Invalid `validation_data`. Received: {received}. Expected (x_val, y_val) numpy arrays, "
                    "(x_val, y_val, sample_weight_val), or a tf.data.Dataset of (x, y) global batches.")


def _is_layer(value) -> bool:
    """A Keras model or layer: callable, but not a function that builds one."""
    import keras

    return isinstance(value, keras.layers.Layer)


def check_run_args(*, strategy, cpu_devices, cluster, task, connect_timeout, progress_timeout, seed, model_dir,
                   shuffle, verbose, callbacks, cluster_resolver=None):
    """Refuse a bad run argument of ``tfdist.fit`` (one line naming it); returns the checked ``RuntimeConfig``
    (its strategy as given: ``auto`` is resolved by ``fit``, which knows whether the process is set up).

    ``model_dir`` may be a new directory, an existing one, or None; never a file.
    """
    import os

    from tfdist import config as config_lib
    from tfdist.rundir import RunDir

    runtime = config_lib.runtime_config(
        "tfdist.fit", strategy=strategy, cpu_devices=cpu_devices, cluster=config_lib.path_text(cluster),
        task="" if task is None else task, connect_timeout=connect_timeout, progress_timeout=progress_timeout)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise UserError(f"Invalid value for `seed`. Received: seed={seed!r}. Expected None or an integer.")
    if model_dir is not None and (not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir).strip()):
        raise UserError(f"Invalid value for `model_dir`. Received: model_dir={model_dir!r}. Expected None (a "
                        "temporary directory) or a directory path.")
    config_lib.check_runtime(runtime)
    config_lib.check_seed(int(seed or 0))
    if model_dir is not None:
        RunDir(model_dir).check_place("model_dir")
    from tfdist.fitting.staging import limit_bytes

    limit_bytes()  # TFDIST_STAGE_LIMIT, read before anything is written (a parameter-server stage reads it later)
    if not isinstance(shuffle, (bool, numbers.Integral)) and shuffle != "batch":
        raise UserError(f"Invalid value for `shuffle`. Received: shuffle={shuffle!r}. Expected a bool, or 'batch' "
                        "(shuffle within each batch), as Keras' fit takes it.")
    if verbose != "auto" and not isinstance(verbose, numbers.Integral):
        raise UserError(f"Invalid value for `verbose`. Received: verbose={verbose!r}. Expected 0, 1, 2 or 'auto'.")
    check_callbacks(callbacks)
    if cluster_resolver is not None and not callable(getattr(cluster_resolver, "cluster_spec", None)):
        raise UserError(f"Invalid `cluster_resolver`. Received: {short(cluster_resolver, 60)} "
                        f"({type(cluster_resolver).__name__}). Expected None (TF_CONFIG, or `cluster`) or a "
                        "tf.distribute.cluster_resolver.ClusterResolver, e.g. tfdist.deploy.in_process."
                        "in_process_cluster(...).")
    return runtime


def check_fit_args(model_fn, x, y, *, batch_size, epochs, initial_epoch, steps_per_epoch, validation_data,
                   validation_steps, sample_weight, class_weight, validation_split=0.0, validation_freq=1) -> tuple:
    """Refuse a bad argument of ``tfdist.fit`` with one line naming it (see the module docstring).

    Returns ``(source, validation)``: the ``inputs.Source`` that trains and the one that validates (None: no
    evaluation), ``validation_split``'s last rows cut off. Each input's kind is decided here, once.
    """
    if not callable(model_fn) or _is_layer(model_fn):
        raise UserError(f"Invalid `model_fn`. Received: a {type(model_fn).__name__} ({model_fn!r:.60}). Expected "
                        "a function that builds and compiles a keras.Model, called inside the strategy's scope.")
    _check_no_arguments(model_fn)
    if not (isinstance(epochs, int) and not isinstance(epochs, bool) and epochs >= 1):
        raise UserError(f"Invalid value for `epochs`. Received: epochs={epochs!r}. Expected a positive integer, the "
                        "epoch to train to.")
    if not (isinstance(initial_epoch, int) and not isinstance(initial_epoch, bool) and 0 <= initial_epoch < epochs):
        raise UserError(f"Invalid value for `initial_epoch`. Received: initial_epoch={initial_epoch!r} with "
                        f"epochs={epochs!r}. Expected an integer with 0 <= initial_epoch < epochs.")
    check_positive_int("steps_per_epoch", steps_per_epoch)
    check_positive_int("validation_steps", validation_steps)
    from tfdist.fitting.inputs import Source

    source = Source.of(x, y, sample_weight)
    _check_inputs(source, batch_size)
    check_total_steps(epochs, steps_per_epoch or 1, epochs_name="epochs", steps_name="steps_per_epoch")
    if class_weight is not None:
        check_class_weight(class_weight, source)
    validation = None if validation_data is None else _validation_source(validation_data)
    at = _check_validation_split(validation_split, source, validation_data)
    _check_validation_freq(validation_freq)
    if steps_per_epoch is None and source.unknown_length():
        raise UserError(f"Missing `steps_per_epoch`. Received: an input of unknown length ({_unknown_length(source)})"
                        ". Expected steps_per_epoch=N.")
    _check_generator_epochs(source, steps_per_epoch, epochs - initial_epoch)
    if validation_steps is None and validation is not None and validation.unknown_length():
        raise UserError(f"Missing `validation_steps`. Received: validation_data of unknown length "
                        f"({_unknown_length(validation)}), which no evaluation would finish. Expected "
                        "validation_steps=N.")
    if at is not None:
        source, validation = source.split(at)
    return source, validation


def _unknown_length(source) -> str:
    """What makes ``source``'s length unknown, in words."""
    from tfdist.fitting.inputs import DATASET_FN, PY_DATASET

    if source.kind == PY_DATASET:
        return "a keras.utils.PyDataset whose num_batches is None: no __len__"
    if source.kind == DATASET_FN:
        return "a dataset_fn"
    return "a tf.data.Dataset that repeats, or whose length TensorFlow does not know"


def _check_generator_epochs(source, steps_per_epoch, epochs: int) -> None:
    """A Python generator without ``steps_per_epoch`` trains one epoch: it ends with its batches, and Keras' ``fit``
    trains each later epoch on the generator's first two batches alone (the ones its adapter read ahead)."""
    from tfdist.fitting.inputs import GENERATOR

    if source.kind == GENERATOR and steps_per_epoch is None and epochs > 1:
        raise UserError(f"Missing `steps_per_epoch` for a Python generator `x` over {epochs} epochs. Received: "
                        "steps_per_epoch=None, where a generator's batches end with its first epoch (Keras' fit "
                        "trains later epochs on its first two batches again). Expected steps_per_epoch=N with a "
                        "generator of at least N * epochs batches, one epoch, or a keras.utils.PyDataset.")


def _check_no_arguments(model_fn) -> None:
    """``model_fn`` is called with no argument: refuse one whose signature needs some."""
    import inspect

    try:
        signature = inspect.signature(model_fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): its call says
        return
    try:
        signature.bind()
    except TypeError as e:
        raise UserError(f"Invalid `model_fn`: it cannot be called without arguments ({e}). Received: "
                        f"{getattr(model_fn, '__name__', type(model_fn).__name__)}{signature}. Expected a function "
                        "of no arguments that builds and compiles a keras.Model.") from None


def _check_weights(name: str, weights, targets) -> None:
    """Sample weights as Keras' loss takes them: an array of finite numbers, whose shape is the targets' first
    dimensions (a weight per example, or per timestep) for one array of targets, and which every output takes for
    a structure of targets; or a structure of them for a structure of targets, of the same kind."""
    import numpy as np

    if weights is None:
        return
    expected = (f"Expected finite numbers, one per example (shape (rows,)) or per timestep, shaped as the first "
                f"dimensions of {'y_val' if name != 'sample_weight' else 'y'}, as Keras' fit takes them.")
    if isinstance(weights, dict) and not isinstance(targets, dict):
        raise UserError(f"Invalid `{name}`: {article(type(weights).__name__)} for {article(type(targets).__name__)} "
                        f"of targets. Received: {short(weights, 60)}. {expected}")
    if not hasattr(weights, "shape"):
        return  # a structure of weights: Keras matches it to the targets' itself
    array = np.asarray(weights)
    if array.dtype.kind not in "biuf":
        raise UserError(f"Invalid `{name}`: not numbers. Received: an array of dtype {array.dtype}. {expected}")
    if not np.isfinite(array).all():
        raise UserError(f"Invalid `{name}`: not finite. Received: {int((~np.isfinite(array)).sum())} NaN or "
                        f"infinite weights. {expected}")
    if not hasattr(targets, "shape"):
        return  # one array of weights that each output of a structure of targets takes
    shape, target_shape = tuple(array.shape), tuple(targets.shape)
    if shape != target_shape[:len(shape)]:
        raise UserError(f"Invalid `{name}` for its targets. Received: weights of shape {shape} for targets of "
                        f"shape {target_shape}. {expected}")


def training_rows(rows: int, validation_split: float) -> int:
    """The rows that train out of ``rows`` under ``validation_split`` (the others validate), as Keras counts them."""
    return int(math.floor(rows * (1.0 - validation_split)))


def _check_validation_split(validation_split, source, validation_data) -> int | None:
    """A fraction in [0, 1) of numpy rows, leaving rows to train and to validate (ignored with validation_data);
    returns the rows that train when the split applies, else None."""
    if isinstance(validation_split, bool) or not isinstance(validation_split, numbers.Real) or not (
            0 <= validation_split < 1):
        raise UserError(f"Invalid value for `validation_split`. Received: validation_split={validation_split!r}. "
                        "Expected a float between 0 and 1 (0: no split).")
    if not validation_split or validation_data is not None:  # validation_data wins, as in Keras' fit
        return None
    if not source.is_arrays:
        raise UserError(f"Invalid `validation_split` with a dataset `x`. Received: validation_split="
                        f"{validation_split!r} and a {type(source.x).__name__}. Expected numpy `x`/`y` (the split "
                        "takes their last rows), or validation_data, as Keras' fit takes it.")
    rows = next(iter(_rows("x", source.x)))
    at = training_rows(rows, validation_split)
    if at in (0, rows):
        raise UserError(f"Invalid value for `validation_split`. Received: validation_split={validation_split!r} "
                        f"of {rows} rows, which leaves no row to train or to validate. Expected a fraction that "
                        "leaves rows to both, or more data.")
    return at


def evaluates_after(epoch: int, validation_freq) -> bool:
    """Whether Keras' ``fit`` evaluates after ``epoch`` (counted from 1) under ``validation_freq`` (int or list)."""
    return epoch in validation_freq if isinstance(validation_freq, list) else epoch % validation_freq == 0


def _check_validation_freq(validation_freq) -> None:
    """Keras' ``validation_freq``: every N-th epoch (an int), or the epochs (counted from 1) in a list."""
    def positive(value) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1

    if not (positive(validation_freq) or (isinstance(validation_freq, list) and validation_freq
                                          and all(positive(epoch) for epoch in validation_freq))):
        raise UserError(f"Invalid value for `validation_freq`. Received: validation_freq={validation_freq!r}. "
                        "Expected a positive int (evaluate after every N-th epoch) or a list of epochs counted "
                        "from 1, as Keras' fit takes it.")


def _check_inputs(source, batch_size) -> None:
    """``x``, ``y`` and ``sample_weight`` (``source``) and ``batch_size`` in one of the forms ``tfdist.fit`` takes."""
    x, y, sample_weight = source.x, source.y, source.sample_weight
    if batch_size is not None:
        check_positive_int("batch_size", batch_size)
    elif not source.own_batches:
        raise UserError("Missing `batch_size`. Received: batch_size=None. Expected the global batch, e.g. 64.")
    if x is None:
        raise UserError("Missing `x`. Received: x=None. Expected numpy arrays with y, a tf.data.Dataset of (x, y) "
                        "batches, or a dataset_fn(InputContext).")
    if not source.is_arrays:
        if y is not None:
            raise UserError("Invalid `y` with a dataset `x`. Received: y given. Expected the dataset to yield (x, y) "
                            "batches and y=None, as Keras' fit takes it.")
        if sample_weight is not None:
            raise UserError("Invalid `sample_weight` with a dataset `x`. Received: sample_weight given. Expected "
                            "the dataset to yield (x, y, sample_weight) batches and sample_weight=None, as Keras' "
                            "fit takes it.")
        from tfdist.fitting.keras_data import check_dataset_elements, check_py_dataset

        if source.is_dataset:
            check_dataset_elements("x", x)
        check_py_dataset("x", x)
        return
    if y is None and sample_weight is not None:
        raise UserError("Invalid `sample_weight` without `y`. Received: numpy x and sample_weight, y=None. Expected "
                        "the targets the weights weigh (y=...), or no sample_weight.")
    _check_dtypes("x", x)
    _check_dtypes("y", y)
    counts = _rows("x", x) | _rows("y", y) | _rows("sample_weight", sample_weight)
    if len(counts) != 1:
        raise UserError(f"Invalid `x`/`y`{'/`sample_weight`' if sample_weight is not None else ''}: their numbers "
                        f"of rows differ. Received: {sorted(counts)}. Expected one row of each per example.")
    _check_some_rows("x", counts)
    _check_weights("sample_weight", sample_weight, y)


def _check_dtypes(name: str, value) -> None:
    """Refuse a numpy array of Python objects in ``value``: Keras' ``fit`` takes no tensor of them ("Invalid dtype:
    object")."""
    for leaf in _flat(value):
        if getattr(getattr(leaf, "dtype", None), "kind", None) == "O":
            raise UserError(f"Invalid `{name}`: an array of Python objects. Received: an array of dtype object, shape "
                            f"{tuple(leaf.shape)}. Expected numbers (or strings) of one dtype, e.g. "
                            "np.asarray(values, dtype='float32'), as Keras' fit takes them.")


def _check_some_rows(name: str, counts: set[int]) -> None:
    """Arrays of one number of rows (``counts``) hold at least one example."""
    if counts == {0}:
        raise UserError(f"Invalid `{name}`: no rows. Received: arrays of 0 rows. Expected at least one example.")


def strategy_name(strategy):
    """``fit``'s ``strategy`` as a name: the Strategy ``tfdist.setup`` returned stands for its session's."""
    if not (hasattr(strategy, "scope") and hasattr(strategy, "num_replicas_in_sync")):
        return strategy  # a name, or a value that check_run_args refuses
    from tfdist.runtime import who

    session = who.current()
    if session is not None and strategy is session.strategy:
        return session.runtime.strategy
    raise UserError(f"Invalid `strategy` for tfdist.fit. Received: {type(strategy).__name__} {short(strategy, 60)}, "
                    "which tfdist.setup did not return. Expected a strategy name (one of "
                    f"{', '.join(STRATEGIES)}) or the Strategy that tfdist.setup returned.")
