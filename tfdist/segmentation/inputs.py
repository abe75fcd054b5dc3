"""The input functions of a run: train and eval pipelines per ``InputContext``, and resuming mid-split.

Each worker builds its own pipeline from ``data.dataset_fn`` (shuffle before
shard with the same seed, so N pipelines' k-th batches are one pipeline's
k-th global batch). What a run adds here: a resumed run skips the batches of
the steps it already took (so it sees the same examples from the resume step
on), eval is cut to ``eval_steps``, and under a coordinator each worker reads
its own order.
"""

from __future__ import annotations

from tfdist.engine.inputs import batches_per_step, per_worker_order


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
    """The whole eval split as one local pipeline (the coordinator, the evaluator, the mask preview)."""
    import tensorflow as tf

    return eval_dataset_fn(config)(tf.distribute.InputContext())
