"""Every private TensorFlow and Keras attribute tfdist reads, in one place: the first things an upgrade breaks."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


def num_input_pipelines(strategy) -> int:
    """The input pipelines (workers) of ``strategy``: ``extended._num_workers``, 1 where it has none."""
    return max(1, int(getattr(strategy.extended, "_num_workers", 1)))


def input_pipeline_id(strategy) -> int:
    """This worker's index among ``strategy``'s input pipelines: ``extended._id_in_cluster``, 0 where it has none."""
    return int(getattr(strategy.extended, "_id_in_cluster", 0))


def op_determinism_enabled() -> bool:
    """Whether ``tf.config.experimental.enable_op_determinism`` is on (TensorFlow has no public getter)."""
    from tensorflow.python.framework.config import is_op_determinism_enabled

    return bool(is_op_determinism_enabled())


def global_seed():
    """TensorFlow's global seed (``tf.random.set_seed``, ``keras.utils.set_random_seed``), None where none is set
    (no public getter)."""
    from tensorflow.python.eager import context

    return context.global_seed()


def keras_data_adapter(x, *, batch_size=None, shuffle=False, class_weight=None, steps_per_epoch=None):
    """Keras' own data adapter of ``x`` (``get_data_adapter``), as its ``fit`` makes it: an input's batches,
    order and class weights exactly as Keras' ``fit`` reads them."""
    from keras.src.trainers.data_adapters import get_data_adapter

    return get_data_adapter(x, batch_size=batch_size, shuffle=shuffle, class_weight=class_weight,
                            steps_per_epoch=steps_per_epoch)


def wait_at_barrier(name: str, timeout_ms: int) -> None:
    """The coordination service's barrier across every task (no public API)."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(name, timeout_ms)


def set_cluster_value(key: str, value: str) -> None:
    """Set ``key`` in the coordination service's key-value store, which every task of the cluster reads (no public
    API)."""
    from tensorflow.python.eager import context

    context.context().set_config_key_value(key, value)


def cluster_value(key: str, timeout_ms: int) -> str:
    """The value of ``key`` in the coordination service's key-value store, once a task has set it (no public API).

    Raises:
      tf.errors.DeadlineExceededError: not set within ``timeout_ms``, or its setter's task is gone.
    """
    from tensorflow.python.eager import context

    return context.context().get_config_key_value(key, timeout_ms)


@contextlib.contextmanager
def checkpoint_manager_in(manager, directory: str) -> Iterator[None]:
    """While it runs, ``tf.train.CheckpointManager`` ``manager`` writes into ``directory`` (its checkpoints, its
    state file, the old checkpoints it deletes); before and after, its records (``latest_checkpoint``,
    ``checkpoints``) name its own directory, as if it had written there."""
    own = manager._directory

    def moved(path, a, b):
        if isinstance(path, str) and (path == a or path.startswith(a.rstrip("/") + "/")):
            return b.rstrip("/") + path[len(a.rstrip("/")):]
        return path

    def move(a, b):
        manager._directory = b
        manager._checkpoint_prefix = moved(manager._checkpoint_prefix, a, b)
        manager._latest_checkpoint = moved(manager._latest_checkpoint, a, b)
        manager._maybe_delete = type(manager._maybe_delete)(
            (moved(path, a, b), stamp) for path, stamp in manager._maybe_delete.items())

    move(own, directory)
    try:
        yield
    finally:
        move(directory, own)


def expand_slurm_hostlist(nodelist: str) -> list[str]:
    """``node[1-3]`` -> ``[node1, node2, node3]``, as TensorFlow's Slurm resolver expands it.

    Raises:
      ValueError: a node list it cannot read.
    """
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import expand_hostlist

    return expand_hostlist(nodelist)


def compiled_loss(model) -> Any:
    """A compiled Keras model's ``CompileLoss`` (``model._compile_loss``), or None before ``compile(loss=...)``."""
    return getattr(model, "_compile_loss", None)


def compiled_metrics(model) -> Any:
    """A compiled Keras model's ``CompileMetrics`` (``model._compile_metrics``), or None."""
    return getattr(model, "_compile_metrics", None)


def loss_trackers(compile_loss) -> list:
    """A built ``CompileLoss``'s per-output loss trackers (its ``metrics``: a ``Mean`` named ``<output>_loss`` per
    output when the model has several losses, none otherwise), in Keras' order."""
    return list(compile_loss.metrics)


def aggregating_value(variable) -> Any:
    """The TensorFlow ``AggregatingVariable`` (``ps_values``) a Keras variable holds (``variable._value``): one
    variable for every replica, as ``CentralStorageStrategy`` makes them; None for another kind, and inside a
    Keras ``StatelessScope`` (its updates are the scope's)."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from tensorflow.python.distribute.ps_values import AggregatingVariable

    value = getattr(variable, "_value", None)
    return value if isinstance(value, AggregatingVariable) and not in_stateless_scope() else None


def unbuild_compiled(compiled) -> None:
    """Mark a ``CompileLoss`` or ``CompileMetrics`` unbuilt, so that Keras' next symbolic build makes its metrics
    anew (a ``CompileLoss`` first drops its per-output loss trackers, ``_metrics``, which its build appends to)."""
    from keras.src.trainers.compile_utils import CompileLoss

    if isinstance(compiled, CompileLoss):
        del compiled._metrics[:]
    compiled.built = False


def flat_losses(compile_loss) -> list:
    """The losses a ``CompileLoss`` holds, one entry per output (``_flat_losses``; each has ``.loss``)."""
    return list(getattr(compile_loss, "_flat_losses", None) or [])


def symbolic_build(model, data_batch) -> None:
    """Build ``model``, its compiled loss and metrics and its optimizer from a data batch (``keras.KerasTensor``s
    will do), as Keras' ``fit`` does (``model._symbolic_build``); under the model's strategy."""
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=data_batch)


def output_spec(fn, *args, **kwargs) -> Any:
    """``fn``'s outputs (``keras.KerasTensor``s) on ``keras.KerasTensor`` arguments, computed in a scratch graph
    with nothing assigned, as Keras' symbolic build calls a model (``keras.src.backend.compute_output_spec``)."""
    from keras.src.backend import compute_output_spec

    return compute_output_spec(fn, *args, **kwargs)


def epoch_element_spec(epoch_iterator) -> Any:
    """The element type of the distributed dataset a Keras ``TFEpochIterator`` iterates (``_distributed_dataset``),
    each per-replica part as its first replica's type (``PerReplicaSpec._value_specs``); read without iterating."""
    import tensorflow as tf

    def first(spec):
        values = getattr(spec, "_value_specs", None)
        return values[0] if values else spec

    return tf.nest.map_structure(first, epoch_iterator._distributed_dataset.element_spec)


def sublayers(model) -> list:
    """Every layer inside ``model``, nested ones too (``model._flatten_layers``)."""
    return list(model._flatten_layers(include_self=False))


#: ``BackupAndRestore``'s private file paths, moved with its ``backup_dir``.
BACKUP_PATHS = ("_weights_path", "_training_metadata_path", "_prev_weights_path", "_prev_training_metadata_path")


def backup_epoch(backup) -> int | None:
    """The epoch a ``keras.callbacks.BackupAndRestore``'s backup resumes at (its training metadata's ``epoch``,
    ``_training_metadata_path``), or None where it has none."""
    import json

    import tensorflow as tf

    path = backup._training_metadata_path
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "r") as f:
        return int(json.loads(f.read())["epoch"])


def fit_initial_epoch(model) -> int | None:
    """The epoch Keras' ``fit`` starts at in place of its ``initial_epoch`` (``model._initial_epoch``, which
    ``BackupAndRestore`` sets when it restores), or None."""
    return getattr(model, "_initial_epoch", None)


def this_task_device(name: str) -> str:
    """``name`` (``/device:CPU:0``) as this process' full device name, its job and task included
    (``device_util.resolve``)."""
    from tensorflow.python.distribute import device_util

    return device_util.resolve(name)


def set_collective_key_base(strategy, base: int) -> None:
    """Make ``strategy``, a strategy object not yet initialised, number its collective groups from ``base + 1``
    (``_collective_key_base``, which ``MirroredStrategy`` reads as it initialises; TensorFlow's own tests raise it
    for each strategy of a process); nothing for a strategy class without collective keys."""
    if hasattr(type(strategy), "_collective_key_base"):
        strategy._collective_key_base = base


def through_autograph(error: BaseException) -> BaseException:
    """``error`` marked to leave a function that autograph converts as it was raised (``ag_pass_through``), not
    as a ``StagingError`` that carries its message over several lines."""
    error.ag_pass_through = True
    return error


def save_backup(backup) -> None:
    """Save a ``keras.callbacks.BackupAndRestore`` now, as it does at an epoch's end (``_save_model``)."""
    backup._save_model()


def keras_tensorflow_trainer():
    """The module of Keras' TensorFlow trainer (``keras.src.backend.tensorflow.trainer``)."""
    from keras.src.backend.tensorflow import trainer

    return trainer


def keras_python_data_adapters() -> tuple:
    """The classes of Keras' data adapters that feed a Python generator's or a ``PyDataset``'s numpy batches to
    ``tf.data.Dataset.from_generator`` (``GeneratorDataAdapter``, ``PyDatasetAdapter``)."""
    from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    return GeneratorDataAdapter, PyDatasetAdapter


def dataset_ops(dataset) -> set[str]:
    """The names of the ops in ``dataset``'s graph, its functions' included (TensorFlow's private
    ``_as_serialized_graph``).

    Raises:
        Exception: whatever TensorFlow raises for a graph it cannot serialize.
    """
    import tensorflow as tf

    serialized = dataset._as_serialized_graph(external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE)
    graph = tf.compat.v1.GraphDef.FromString(serialized.numpy())
    return {node.op for node in graph.node} | {node.op for f in graph.library.function for node in f.node_def}


def keras_tf_dataset_adapter():
    """The class of Keras' data adapter of a user's ``tf.data.Dataset`` (``TFDatasetAdapter``)."""
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

    return TFDatasetAdapter


def keras_tensorflow_optimizer():
    """The class of Keras' TensorFlow optimizer (``keras.src.backend.tensorflow.optimizer.TFOptimizer``)."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return TFOptimizer


def keras_compile_loss():
    """The class of a compiled model's loss (``keras.src.trainers.compile_utils.CompileLoss``): its ``call``
    updates one loss tracker per output."""
    from keras.src.trainers.compile_utils import CompileLoss

    return CompileLoss


def keras_loss_module():
    """The module of Keras' ``Loss``, whose functions scale a loss for N replicas (``keras.src.losses.loss``)."""
    from keras.src.losses import loss

    return loss


def is_multi_worker(strategy) -> bool:
    """Whether Keras' trainer takes ``strategy`` for one across workers (``_collective_all_reduce_multi_worker``)."""
    return bool(keras_tensorflow_trainer()._collective_all_reduce_multi_worker(strategy))


@contextlib.contextmanager
def collective_keys_at_trace_time() -> Iterator[None]:
    """Collectives traced meanwhile take their instance keys when traced, not when called.

    TensorFlow feeds a call-time key (``CollectiveReplicaLauncher._prefer_unique_instance_key``)
    through a placeholder that never reaches a collective inside a ``tf.function`` called from a
    ``tf.cond`` in a ``tf.while_loop``, as Keras' ``steps_per_execution`` loop calls its step.
    A key taken when traced serves every execution of its op; a collective whose shape is known
    only when it runs takes a key per execution (``collective_keys_per_execution``).
    """
    from tensorflow.python.distribute.cross_device_utils import CollectiveReplicaLauncher

    before = CollectiveReplicaLauncher._prefer_unique_instance_key
    CollectiveReplicaLauncher._prefer_unique_instance_key = False
    try:
        with collective_keys_per_execution():
            yield
    finally:
        CollectiveReplicaLauncher._prefer_unique_instance_key = before


@contextlib.contextmanager
def collective_keys_per_execution() -> Iterator[None]:
    """Collectives traced meanwhile on a tensor whose shape is known only when they run take a key per execution.

    TensorFlow keys a collective once per call of its ``tf.function`` (a loop's iterations share the
    key) and holds an instance to the shape it first ran with, so the padded gather of an
    ``IndexedSlices`` gradient, whose rows follow the batch, fails in a loop of steps whose last
    batch is smaller ("Shape mismatch in the collective instance"). Such a collective takes its key
    per execution instead, ``_KEYS_PER_EXECUTION`` on from a counter of its group's on its device,
    which every worker advances in the same order; a collective of a known shape keeps TensorFlow's key.
    """
    from tensorflow.python.distribute.cross_device_utils import CollectiveReplicaLauncher

    methods = {name: getattr(CollectiveReplicaLauncher, name) for name in ("_all_gather", "all_reduce")}
    for name, method in methods.items():
        setattr(CollectiveReplicaLauncher, name, _key_per_execution_unless_shaped(method))
    try:
        yield
    finally:
        for name, method in methods.items():
            setattr(CollectiveReplicaLauncher, name, method)


#: The first instance key of a collective keyed per execution: above the keys TensorFlow's counters hand out.
_KEYS_PER_EXECUTION = 2**30
#: The counter of executions of each collective group on each device (launchers of one group share it).
_EXECUTIONS: dict = {}


def _key_per_execution_unless_shaped(method):
    """``method(launcher, tensor, ...)`` that keys a collective on a tensor of an unknown shape per execution."""
    import functools

    @functools.wraps(method)
    def keyed(self, input_tensor, *args, **kwargs):
        import tensorflow as tf

        if tf.executing_eagerly() or tf.convert_to_tensor(input_tensor).shape.is_fully_defined():
            return method(self, input_tensor, *args, **kwargs)
        counter = _EXECUTIONS.get((self._group_key, self._device))
        if counter is None:
            from tensorflow.python.ops import resource_variable_ops

            with tf.init_scope(), tf.device("CPU:0"):  # this process' own: outside any strategy's variables
                counter = resource_variable_ops.ResourceVariable(0, dtype=tf.int32, trainable=False)
            _EXECUTIONS[(self._group_key, self._device)] = counter
        with tf.device("CPU:0"):
            key = _KEYS_PER_EXECUTION + counter.assign_add(1, read_value=True)
        self._next_instance_key = lambda: key
        try:
            return method(self, input_tensor, *args, **kwargs)
        finally:
            del self._next_instance_key

    return keyed


@contextlib.contextmanager
def model_without_strategy(model):
    """While it runs: ``model`` has no strategy of its own (Keras' trainer then uses the default one)."""
    previous = model._distribute_strategy
    model._distribute_strategy = None
    try:
        yield
    finally:
        model._distribute_strategy = previous
