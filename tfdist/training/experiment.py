"""``run(config)``: one experiment, config -> strategy -> data -> model -> loop -> outputs.

This is the library behind ``python -m tfdist.train`` and what a notebook
calls. The order matters and is fixed here:

1. everything the user gave is checked (config, cluster, run directory)
   before anything is written, so a bad run never damages ``model_dir``;
2. TF_CONFIG, logical CPUs and the inter-op pool are set before TensorFlow
   starts, and MultiWorkerMirroredStrategy is created before any other op
   (collectives must be configured first, DESIGN.md);
3. model, optimizer and step counter are built under the strategy's scope,
   restored from the latest checkpoint if there is one, and trained by the
   loop for the strategy (synchronous or parameter-server);
4. the chief writes the outputs; other workers write nothing that survives.

In a cluster the task's type picks its role first (``roles.role``): ps and
worker tasks of ``parameter_server`` serve the chief, an evaluator follows the
checkpoints, and the rest train. Waiting for peers is bounded by
``--connect_timeout`` and a lost peer ends the run with one line (``roles``).

Debugging aid: with ``TFDIST_DEBUG_WEIGHTS_DIR=DIR`` in the environment,
every training task writes its final weights to ``DIR/<type>-<index>.npz``
(``local.npz`` outside a cluster), so that tests can compare the weights of
workers that write no outputs.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import yaml

from tfdist import cluster as cluster_lib
from tfdist import config as config_lib
from tfdist.errors import UserError
from tfdist.training import roles

#: Settings that must not change between a run and its resumption.
_RESUME_KEYS = {"data": ("dataset", "image_size", "num_classes"), "model": tuple(f.name for f in dataclasses.fields(config_lib.ModelConfig))}


def check_model_dir(config) -> None:
    """Refuse to resume a run directory whose model or data differ from ``config``."""
    params = Path(config.train.model_dir) / "params.yaml"
    if not params.is_file():
        return
    try:
        old = yaml.safe_load(params.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"Cannot read {params}: {e}. Expected the params.yaml of an earlier tfdist run.") from None
    new = config_lib.to_dict(config)
    for section, keys in _RESUME_KEYS.items():
        for key in keys:
            before = (old.get(section) or {}).get(key)
            if before is not None and before != new[section][key]:
                raise UserError(
                    f"Invalid --model_dir {config.train.model_dir}: it holds a run with {section}.{key}={before!r}. "
                    f"Received: {key}={new[section][key]!r}. Expected the same value to resume, or a new --model_dir."
                )


@dataclasses.dataclass(frozen=True)
class Task:
    """This process's place in the cluster (a single process has no cluster)."""

    spec: cluster_lib.ClusterSpec | None = None
    type: str = ""
    index: int = 0

    @property
    def is_chief(self) -> bool:
        return self.spec is None or self.spec.is_leader(self.type, self.index)

    def num_workers(self, strategy: str) -> int:
        """Tasks that compute steps: the workers, and the chief too unless it coordinates (parameter_server)."""
        if self.spec is None:
            return 1
        workers = len(self.spec.tasks.get("worker", ()))
        return workers if strategy == "parameter_server" else workers + len(self.spec.tasks.get("chief", ()))


def resolve_cluster(config) -> Task:
    """Find this task (``--cluster/--task`` or TF_CONFIG), check it fits the strategy, export TF_CONFIG."""
    rt = config.runtime
    found = cluster_lib.resolve_task(rt.cluster or None, rt.task or None, slurm_tasks=rt.slurm_tasks)
    if found is None:
        if rt.strategy == "parameter_server":
            raise UserError(
                "Missing cluster for strategy=parameter_server. Received: no --cluster and no TF_CONFIG. "
                "Expected --cluster FILE --task TYPE:I with a chief, workers and ps."
            )
        return Task()
    spec, task_type, index = found
    cluster_lib.check_strategy(spec, rt.strategy)
    if task_type != "evaluator":
        # TensorFlow's resolvers read TF_CONFIG; the evaluator is not part of the cluster that trains.
        os.environ["TF_CONFIG"] = cluster_lib.tf_config_json(roles.training_spec(spec), task_type, index)
    public = cluster_lib.public_addresses(spec)
    if public:
        from absl import logging

        logging.warning(
            "The cluster spec %s has addresses that may be reachable from outside: %s. TensorFlow's gRPC "
            "server has no authentication and runs what it receives: use an isolated network.",
            spec.source, ", ".join(public),
        )
    return Task(spec=spec, type=task_type, index=index)


def _setup_tensorflow(config, task: Task, cluster_resolver=None):
    """Devices, threads, precision, seeds and determinism, then the strategy."""
    from tfdist import strategies

    rt = config.runtime
    if rt.strategy == "parameter_server":
        strategies.grpc_fail_fast_for_parameter_server()
    cpu_devices = rt.cpu_devices or strategies.default_cpu_devices(rt.strategy)
    inter_op = task.spec.num_tasks + 1 if task.spec else 0
    strategies.setup_host(cpu_devices=cpu_devices if rt.strategy in strategies.LOCAL_MULTI_DEVICE else 1,
                          inter_op_threads=inter_op)
    # The peers meet (bounded by --connect_timeout) right before the strategy binds the gRPC port.
    with roles.joining(task.spec and roles.training_spec(task.spec), task.type, task.index, rt.connect_timeout,
                       listen=rt.strategy == "multi_worker_mirrored"):
        strategy = strategies.make_strategy(
            rt.strategy, cpu_devices=cpu_devices, cluster_resolver=cluster_resolver, communication=rt.communication,
            bytes_per_pack=rt.bytes_per_pack, collective_timeout=rt.collective_timeout, ps_shards=rt.ps_shards,
            ps_min_shard_bytes=rt.ps_min_shard_bytes,
        )
    _setup_keras(config)
    return strategy


def _setup_keras(config) -> None:
    """Precision policy, seeds and op determinism (after the strategy: collectives come first)."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_dtype_policy(config.runtime.precision)
    keras.utils.set_random_seed(config.train.seed)
    if config.train.deterministic:
        tf.config.experimental.enable_op_determinism()


def _evaluate(config, task: Task, verbose: bool) -> dict:
    """The evaluator task: one CPU device, no strategy, a plain model; see ``roles.evaluate_checkpoints``."""
    from tfdist import data as data_lib
    from tfdist import strategies
    from tfdist.models import build_from_config

    strategies.setup_host(cpu_devices=1)
    _setup_keras(config)
    data_lib.validate_data(config.data)
    return roles.evaluate_checkpoints(task.spec, config, model=build_from_config(config.model, config.data),
                                      eval_dataset=_local_eval_dataset(config), verbose=verbose)


def _dump_weights_for_debugging(task: Task, model) -> None:
    """``TFDIST_DEBUG_WEIGHTS_DIR``: this task's final weights as ``<type>-<index>.npz`` (see the module doc)."""
    directory = os.environ.get("TFDIST_DEBUG_WEIGHTS_DIR")
    if not directory:
        return
    import numpy as np

    Path(directory).mkdir(parents=True, exist_ok=True)
    name = f"{task.type}-{task.index}" if task.spec else "local"
    np.savez(Path(directory) / f"{name}.npz", *model.get_weights())


def _batches_per_step(context) -> int:
    """Per-replica batches one input pipeline yields per global step."""
    return max(1, context.num_replicas_in_sync // context.num_input_pipelines)


def _train_dataset_fn(config, start_step: int):
    from tfdist import data as data_lib

    base = data_lib.dataset_fn(config.data, "train", global_batch_size=config.train.global_batch_size,
                               seed=config.train.seed, training=True)
    if config.runtime.strategy == "parameter_server":
        return _per_worker_order(base)

    def fn(context):
        # Resuming at step s skips the batches of steps < s, so a resumed run sees the same data.
        return base(context).skip(start_step * _batches_per_step(context))

    return fn


def _per_worker_order(base, batches: int = 16):
    """Parameter server: give each worker its own order of the batches.

    The coordinator traces the dataset function once and every worker runs
    that same graph with one input pipeline, so with a fixed seed all workers
    would read the same batches in the same order. A shuffle seeded by the
    worker's clock when its pipeline starts makes the orders differ; async
    training is not reproducible step for step anyway.
    """
    import tensorflow as tf

    def fn(context):
        seed = tf.cast(tf.timestamp() * 1e6, tf.int64) % (2**31)
        return base(context).shuffle(batches, seed=seed)

    return fn


def _eval_dataset_fn(config):
    from tfdist import data as data_lib

    base = data_lib.dataset_fn(config.data, "eval", global_batch_size=config.train.global_batch_size,
                               seed=config.train.seed, training=False)
    eval_steps = config.train.eval_steps

    def fn(context):
        ds = base(context)
        return ds.take(eval_steps * _batches_per_step(context)) if eval_steps else ds

    return fn


def _local_eval_dataset(config):
    import tensorflow as tf

    return _eval_dataset_fn(config)(tf.distribute.InputContext())


def _can_jit(config, strategy) -> bool:
    """``--jit_compile``, where XLA can compile the forward and backward pass.

    With several replicas in sync, batch norm all-reduces its statistics
    inside the pass (a ``merge_call``), which a nested XLA function cannot
    hold; and with op determinism on, XLA lacks deterministic kernels. There
    the pass runs uncompiled and a warning says so.
    """
    if not config.runtime.jit_compile:
        return False
    from absl import logging
    from tensorflow.python.framework.config import is_op_determinism_enabled

    if is_op_determinism_enabled():
        # As Keras does: XLA has no deterministic implementation of some ops (MaxPool's gradient).
        logging.warning("--jit_compile is ignored: op determinism is on (--deterministic) and XLA cannot honour it.")
        return False
    if strategy.num_replicas_in_sync > 1 and config.model.batch_norm:
        logging.warning(
            "--jit_compile is ignored with %d replicas and batch norm: cross-replica batch statistics "
            "cannot run inside an XLA-compiled step. Use --nobatch_norm or one replica per worker to compile.",
            strategy.num_replicas_in_sync,
        )
        return False
    return True


def steps_per_epoch(config) -> int:
    """``train.steps_per_epoch``, or the train split's size over the global batch."""
    if config.train.steps_per_epoch:
        return config.train.steps_per_epoch
    from tfdist import data as data_lib

    return max(1, data_lib.num_examples(config.data, "train") // config.train.global_batch_size)


def run(config, *, verbose: bool = True, cluster_resolver=None) -> dict:
    """Train and evaluate ``config``; returns the summary (also written to ``summary.json``).

    Args:
      config: a ``tfdist.config.Config``.
      verbose: print progress on the chief.
      cluster_resolver: a cluster for ``parameter_server`` or
        ``multi_worker_mirrored`` that this process coordinates, e.g. from
        ``tfdist.local_cluster.in_process_cluster``; None reads --cluster/TF_CONFIG.

    Raises:
      UserError: bad input (config, cluster, data, run directory).
      TrainingDiverged: the loss became NaN or Inf.
    """
    wall_start = time.perf_counter()
    config = config_lib.validate(config)
    task = Task() if cluster_resolver is not None else resolve_cluster(config)
    check_model_dir(config)
    rt = config.runtime
    kind = roles.role(task.type, rt.strategy)
    if kind == "evaluate":
        return _evaluate(config, task, verbose)
    if task.spec is not None:
        roles.check_port_free(task.spec, task.type, task.index)
    if kind == "serve":
        roles.serve(task.spec, task.type, task.index, connect_timeout=rt.connect_timeout, verbose=verbose)
    strategy = _setup_tensorflow(config, task, cluster_resolver)
    with roles.peer_errors(task.spec, task.type, task.index, rt.strategy, config.train.model_dir):
        return _train(config, task, strategy, verbose=verbose, wall_start=wall_start)


def _train(config, task: Task, strategy, *, verbose: bool, wall_start: float) -> dict:
    """Build, restore, train, evaluate and write the outputs under ``strategy``; returns the summary."""
    import tensorflow as tf

    from tfdist import data as data_lib
    from tfdist.models import build_from_config
    from tfdist.training.checkpoints import Checkpoints
    from tfdist.training.controller import Controller
    from tfdist.training.coordinator_loop import CoordinatorLoop
    from tfdist.training.optimizers import learning_rate_at, make_optimizer
    from tfdist.training.outputs import RunOutputs
    from tfdist.training.step import Steps
    from tfdist.training.sync_loop import SyncLoop

    data_lib.validate_data(config.data)
    train_cfg = config.train
    epoch_steps = steps_per_epoch(config)
    total_steps = train_cfg.epochs * epoch_steps

    with strategy.scope():
        model = build_from_config(config.model, config.data)
        optimizer = make_optimizer(train_cfg, config.runtime.precision, total_steps)
        optimizer.build(model.trainable_variables)
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    checkpoints = Checkpoints(checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_counter),
                              model_dir=train_cfg.model_dir, is_chief=task.is_chief, task=f"{task.type}:{task.index}")
    restored = checkpoints.restore_latest()
    start_step = int(step_counter.numpy())
    is_chief = task.is_chief
    outputs = RunOutputs(model_dir=train_cfg.model_dir, is_chief=is_chief)
    outputs.write_params(config)
    if verbose and is_chief:
        where = f"resuming from {restored} at step {start_step}" if restored else "starting at step 0"
        print(f"tfdist: {config.runtime.strategy} with {strategy.num_replicas_in_sync} replicas, "
              f"global batch {train_cfg.global_batch_size}, {total_steps} steps; {where}", flush=True)

    steps = Steps(model=model, optimizer=optimizer, num_classes=config.data.num_classes,
                  global_batch_size=train_cfg.global_batch_size, jit_compile=_can_jit(config, strategy))
    if config.runtime.strategy == "parameter_server":
        tf.random.set_seed(None)  # weights are initialised; now each worker's data order is its own
        loop = CoordinatorLoop(strategy=strategy, steps=steps, step_counter=step_counter,
                               train_dataset_fn=_train_dataset_fn(config, start_step),
                               eval_dataset=_local_eval_dataset(config))
    else:
        loop = SyncLoop(strategy=strategy, steps=steps, step_counter=step_counter,
                        train_dataset_fn=_train_dataset_fn(config, start_step),
                        eval_dataset_fn=_eval_dataset_fn(config))
    preview = next(iter(_local_eval_dataset(config).unbatch().batch(4).take(1))) if is_chief else None
    controller = Controller(
        loop=loop, checkpoints=checkpoints, outputs=outputs, num_classes=config.data.num_classes,
        global_batch_size=train_cfg.global_batch_size, steps_per_epoch=epoch_steps,
        steps_per_loop=train_cfg.steps_per_loop, log_every=train_cfg.log_every,
        checkpoint_every=train_cfg.checkpoint_every, learning_rate=lambda s: learning_rate_at(train_cfg, total_steps, s),
        preview=preview, verbose=verbose and is_chief,
    )
    try:
        final_eval = controller.run(start_step, total_steps)
    finally:
        checkpoints.close()
        outputs.close()
    _dump_weights_for_debugging(task, model)
    if is_chief and train_cfg.export:
        plain = build_from_config(config.model, config.data)
        plain.set_weights(model.get_weights())
        outputs.export(plain)
    summary = {
        "strategy": config.runtime.strategy,
        "num_replicas": int(strategy.num_replicas_in_sync),
        "num_workers": task.num_workers(config.runtime.strategy),
        "is_chief": is_chief,
        "global_batch_size": train_cfg.global_batch_size,
        "steps": int(step_counter.numpy()),
        "start_step": start_step,
        "final_loss": controller.last_train.get("loss") if controller.last_train else None,
        "eval": {k: final_eval[k] for k in ("loss", "mean_iou", "pixel_accuracy")},
        "images_per_second": controller.images_per_second,
        "first_step_at": controller.first_step_at,
        "wall_seconds": time.perf_counter() - wall_start,
        "precision": config.runtime.precision,
        "model_dir": str(train_cfg.model_dir),
        "variable_devices": sorted({v.value.device for v in model.variables}),
    }
    outputs.write_summary(summary)
    roles.finish_together(task.spec, config.runtime.strategy, config.runtime.connect_timeout)
    return summary
