"""What a coordinator's chief stages of ``tfdist.fit``'s Dataset input for its workers
(``inputs.Source.dataset_fns`` with a ``stage_dir``), in this process:

- a Dataset that repeats without end stages the batches its steps take, the stream one process reads
  (a resumed run goes on at its step), with one line saying so;
- one of unknown length (``.filter``, a generator) stages at most that many, a shorter one whole;
- over ``TFDIST_STAGE_LIMIT``, a size known beforehand is refused before anything is written, and one found
  while writing stops there, its save ended: one ``UserError`` naming the size and the limit, and no stage
  is left;
- a preemption signal while staging ends the stage as it ends a run: ``Preempted``, once the save has ended,
  and no stage is left.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import Preempted, UserError
from tfdist.fitting.inputs import Source
from tfdist.runtime.preemption import Preemption


def _staged(x, stage_dir, *, total_steps, training=False, start_step=0, take=None):
    """The x parts of the batches the workers would read (one replica), after staging ``x`` in ``stage_dir``."""
    fn, _ = Source.of(x).dataset_fns(batch_size=None, shuffle=False, seed=0, training=training,
                                     start_step=start_step, stage_dir=stage_dir, total_steps=total_steps)
    batches = fn(tf.distribute.InputContext())
    return [part[0].numpy().tolist() for part in (batches.take(take) if take else batches)]


def _pairs(n):
    return tf.data.Dataset.range(n).map(lambda i: (i, -i))


@pytest.fixture
def small_limit(monkeypatch):
    """A staging limit of 100000 bytes: a stage that would not end stops at once."""
    monkeypatch.setenv("TFDIST_STAGE_LIMIT", "100000")


def test_a_dataset_that_repeats_without_end_stages_the_batches_its_steps_take(tmp_path, capfd, small_limit):
    x = _pairs(10).batch(4).repeat()
    stream = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]
    assert [b[0].numpy().tolist() for b in x.take(7)] == stream  # one process's batches, epoch after epoch
    assert _staged(x, tmp_path / "stage", total_steps=7) == stream
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]  # the stage, complete, under its name
    err = capfd.readouterr().err
    assert "tfdist: the Dataset x repeats without end: its first 7 batches, one for each step up to step 7" in err
    # A run resumed at step 3 goes on with the stream's batch 3.
    assert _staged(x, tmp_path / "stage", total_steps=7, training=True, start_step=3, take=4) == stream[3:7]


def test_a_dataset_of_unknown_length_stages_at_most_its_steps_batches(tmp_path, capfd, small_limit):
    short = _pairs(10).filter(lambda a, b: a % 2 == 0).batch(2)  # 3 batches; TensorFlow does not know it
    assert int(short.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    assert _staged(short, tmp_path / "a", total_steps=100) == [[0, 2], [4, 6], [8]]
    assert "is of unknown length: at most its first 100 batches" in capfd.readouterr().err

    def endless():
        for i in itertools.count():
            yield np.int64(i), np.int64(-i)

    spec = (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64))
    generated = tf.data.Dataset.from_generator(endless, output_signature=spec).batch(3)
    assert _staged(generated, tmp_path / "b", total_steps=4) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]


def test_a_stage_over_the_limit_is_one_user_error_naming_its_size_and_leaves_no_stage(tmp_path, monkeypatch,
                                                                                     small_limit):
    limit = "the staging limit of 97.7 KiB (TFDIST_STAGE_LIMIT=100000)"
    # Known beforehand, from the Dataset's type (not a batch of it): 2000 steps of 10 int64 pairs, 160 bytes each
    # (about 312.5 KiB); nothing is written.
    with pytest.raises(UserError) as known:
        _staged(_pairs(20).batch(10, drop_remainder=True).repeat(), tmp_path / "known", total_steps=2000)
    assert str(known.value).startswith(
        "Invalid `x` under parameter_server: the first 2000 batches of the Dataset x must be staged on disk for "
        f"the workers, and its stage would take about 312.5 KiB, over {limit}. Expected fewer epochs or "
        "steps_per_epoch, or x as a dataset_fn"), known.value
    assert not list(tmp_path.iterdir())
    # Found while writing: a Dataset of unknown length stops at the limit, its save ends (it would take minutes
    # more), and what it wrote is removed.
    with pytest.raises(UserError) as found:
        _staged(_pairs(10 ** 7).filter(lambda a, b: a >= 0), tmp_path / "found", total_steps=10 ** 7)
    assert " of the Dataset x must be staged on disk for the workers, and its stage reached " in str(found.value)
    assert f"before its end, over {limit}." in str(found.value)
    assert not [thread for thread in threading.enumerate() if thread.name == "tfdist-stage"]
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("TFDIST_STAGE_LIMIT", "2GB")
    with pytest.raises(UserError, match=r"^Invalid TFDIST_STAGE_LIMIT. Received: TFDIST_STAGE_LIMIT='2GB'. "
                                        r"Expected a positive number of bytes \(default 2147483648\).$"):
        _staged(_pairs(4).batch(2), tmp_path / "bad", total_steps=1)


def test_a_preemption_signal_while_staging_ends_the_save_before_its_files_are_removed(tmp_path):
    made = []

    def slow(i):
        time.sleep(0.3)  # the save ends only once the element it is making is made
        made.append(int(i))
        return i

    def made_slowly(a, b):
        return tf.py_function(slow, [a], tf.int64), b

    x = _pairs(10 ** 6).map(made_slowly).filter(lambda a, b: a >= 0)  # of unknown length: staged while read
    timer = threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGUSR1))
    with Preemption("local"), pytest.raises(Preempted, match="^Preempted: local received SIGUSR1 before its first"):
        timer.start()
        _staged(x, tmp_path / "stage", total_steps=10 ** 6)
    made_when_raised = len(made)
    timer.join()
    deadline = time.monotonic() + 60  # not Thread.join: a thread marked ended too early returns from it at once
    while any(thread.name == "tfdist-stage" for thread in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(made) == made_when_raised, "the save was still making elements when its stage was removed"
    assert not list(tmp_path.iterdir())
