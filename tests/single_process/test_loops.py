"""The loops' contract (``engine.loop.Loop``) on a real strategy, with steps that only count what they see.

The steps return ``[sum of the batch, examples]``: what ``train(n)`` and
``evaluate()`` return is then known exactly from the data, whatever the loop
does inside its ``tf.function``.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tfdist import _compat
from tfdist.keras_fit.owned_batches import PYTHON_OPS
from tfdist.runtime.run_loop import make_loop
from tfdist.runtime.watchdog import BatchCounter


class SummingSteps:
    """``engine.steps.Steps`` whose stats are the sum of the replica's batch and its size."""

    count_key = "examples"
    stats_size = 2

    def train(self, batch):
        return tf.stack([tf.reduce_sum(batch), tf.cast(tf.shape(batch)[0], tf.float32)])

    evaluate = train

    def metrics(self, stats):
        return {"sum": float(stats[0]), "examples": int(stats[1])}

    def describe(self, split, result):
        return ""


def one_device_loop(batch=2, several_steps=False, batches=None):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64, trainable=False)

    def train_fn(context):  # 0, 1, 2, ... in batches, repeated
        return tf.data.Dataset.range(10).map(lambda v: tf.cast(v, tf.float32)).repeat().batch(batch)

    def eval_fn(context):  # 7 examples: an uneven last batch
        return tf.data.Dataset.range(7).map(lambda v: tf.cast(v, tf.float32)).batch(batch)

    return make_loop(coordinator=False, strategy=strategy, steps=SummingSteps(), step_counter=counter,
                     train_dataset_fn=batches.wrap(train_fn) if batches else train_fn, eval_dataset_fn=eval_fn, several_steps=several_steps)


def test_train_sums_the_stats_of_its_steps_and_counts_them():
    loop = one_device_loop()
    stats, stop = loop.train(3)
    assert stats.tolist() == [float(sum(range(6))), 6.0] and stop is False
    assert loop.step() == 3
    stats, _ = loop.train(1)  # the one-step function: the next batch of the same iterator
    assert stats.tolist() == [6.0 + 7.0, 2.0] and loop.step() == 4


def test_the_batch_counter_counts_what_the_steps_took_without_python_in_the_pipeline():
    # A Python function in an input pipeline hangs the process when its iterator is deleted while an input
    # thread waits for the interpreter's lock: the counter's pipeline must hold none.
    batches = BatchCounter(start_step=5)
    loop = one_device_loop(batches=batches)
    assert batches.fed == 5
    stats, _ = loop.train(3)
    # The pipeline may read ahead of the steps (tf.data's own prefetch): at least the batches they took.
    assert stats.tolist() == [float(sum(range(6))), 6.0] and batches.fed >= 5 + 3
    ops = _compat.dataset_ops(batches.wrap(lambda context: tf.data.Dataset.range(4).batch(2))(
        tf.distribute.InputContext()))
    assert "AssignAddVariableOp" in ops and not ops & PYTHON_OPS


def test_a_loop_of_several_step_chunks_runs_one_step_chunks_in_the_same_function_traced_once():
    loop = one_device_loop(several_steps=True)
    sums = [loop.train(n)[0].tolist() for n in (1, 3, 1, 2)]
    assert sums == [[1.0, 2.0], [float(sum(range(2, 8))), 6.0], [17.0, 2.0], [0.0 + 1 + 2 + 3, 4.0]]
    assert loop.step() == 7
    assert loop._train_fn.experimental_get_tracing_count() == 1
    assert loop._train_one_fn.experimental_get_tracing_count() == 0


def test_a_stop_vote_comes_back_with_the_steps_it_was_cast_with():
    loop = one_device_loop()
    assert loop.train(2, stop=lambda: True)[1] is True
    assert loop.train(2, stop=lambda: False)[1] is False
    assert loop.step() == 4


def test_agree_is_true_when_this_task_says_so():
    loop = one_device_loop()
    assert loop.agree(True) is True and loop.agree(False) is False


@pytest.mark.parametrize("passes", [1, 2])
def test_evaluate_sums_one_whole_pass_each_time(passes):
    loop = one_device_loop()
    for _ in range(passes):
        assert loop.evaluate().tolist() == [float(sum(range(7))), 7.0]
    assert loop.step() == 0  # evaluation counts no step
