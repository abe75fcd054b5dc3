"""Input helpers every client's pipelines share: batches per global step, and a coordinator's per-worker order."""

from __future__ import annotations


def batches_per_step(context) -> int:
    """Per-replica batches one input pipeline yields per global step."""
    return max(1, context.num_replicas_in_sync // context.num_input_pipelines)


def per_worker_order(base, batches: int = 16, seed: int = 0):
    """Under a coordinator: give each worker its own order of the batches.

    The coordinator traces the dataset function once and every worker runs
    that same graph with one input pipeline, so one shuffle with one seed
    would draw the same numbers on every worker. Each worker reads its index
    when its pipeline is made on it (``experimental_get_current_worker_index``),
    skips that many batches (modulo ``batches``) and shuffles with a buffer
    that many batches longer: its stream starts elsewhere and the same draws
    pick other places of another buffer, so the orders differ. The shuffle's
    seed is the Python int ``seed``: a tensor seed reaches
    ``random_seed.get_seed``, which compares it as a Python bool when the
    global seed is 0 (failing in a graph), and ``seed=None`` fails under op
    determinism. Asynchronous training is not reproducible step for step anyway.
    """
    import tensorflow as tf

    def fn(context):
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64) % batches
        return base(context).skip(worker).shuffle(batches + worker, seed=seed)

    return fn
