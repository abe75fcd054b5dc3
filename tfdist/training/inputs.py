"""The input functions of a run: train and eval pipelines per ``InputContext``, and resuming mid-split.

Each worker builds its own pipeline from ``data.dataset_fn`` (shuffle before
shard with the same seed, so N pipelines' k-th batches are one pipeline's
k-th global batch). What a run adds here: a resumed run skips the batches of
the steps it already took (so it sees the same examples from the resume step
on), eval is cut to ``eval_steps``, and under a coordinator each worker reads
its own order.
"""

from __future__ import annotations


def batches_per_step(context) -> int:
    """Per-replica batches one input pipeline yields per global step."""
    return max(1, context.num_replicas_in_sync // context.num_input_pipelines)


def train_dataset_fn(config, start_step: int, *, own_order_per_worker: bool = False):
    """``InputContext -> Dataset`` of the train split, repeated, from global step ``start_step`` on.

    Args:
        config: the run's config.
        start_step: the step the run starts (or resumes) at; the batches of
            earlier steps are skipped, so a resumed run sees the same data.
        own_order_per_worker: each worker reads its own order (asynchronous
            strategies with a coordinator, see ``per_worker_order``); then
            nothing is skipped: the order is not reproducible anyway.
    """
    from tfdist import data as data_lib

    base = data_lib.dataset_fn(config.data, "train", global_batch_size=config.train.global_batch_size,
                               seed=config.train.seed, training=True)
    if own_order_per_worker:
        return per_worker_order(base, seed=config.train.seed)

    def fn(context):
        # Resuming at step s skips the batches of steps < s, so a resumed run sees the same data.
        return base(context).skip(start_step * batches_per_step(context))

    return fn


def per_worker_order(base, batches: int = 16, seed: int = 0):
    """Under a coordinator: give each worker its own order of the batches.

    The coordinator traces the dataset function once and every worker runs
    that same graph with one input pipeline, so one shuffle with one seed
    would draw the same numbers on every worker. Each worker reads its index
    when its pipeline is made on it (``experimental_get_current_worker_index``),
    skips that many batches (modulo ``batches``) and shuffles with a buffer
    that many batches longer: its stream starts elsewhere and the same draws
    pick other places of another buffer, so the orders differ. The shuffle's
    seed is the Python int ``seed``: a tensor seed fails in a graph
    (``random_seed.get_seed`` tests it as a bool when the global seed is 0),
    and ``seed=None`` fails under op determinism.
    """
    import tensorflow as tf

    def fn(context):
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64) % batches
        return base(context).skip(worker).shuffle(batches + worker, seed=seed)

    return fn


def eval_dataset_fn(config):
    """``InputContext -> Dataset`` of the eval split, finite (``eval_steps`` global steps, or all of it)."""
    from tfdist import data as data_lib

    base = data_lib.dataset_fn(config.data, "eval", global_batch_size=config.train.global_batch_size,
                               seed=config.train.seed, training=False)
    eval_steps = config.train.eval_steps

    def fn(context):
        ds = base(context)
        return ds.take(eval_steps * batches_per_step(context)) if eval_steps else ds

    return fn


def local_eval_dataset(config):
    """The whole eval split as one local pipeline (the coordinator, the evaluator, previews)."""
    import tensorflow as tf

    return eval_dataset_fn(config)(tf.distribute.InputContext())
