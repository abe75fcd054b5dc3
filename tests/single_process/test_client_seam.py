"""A client's methods in the order the driver documents (``engine.client.Client``), in this process: each needs only
what the ones before it made. ``tfdist.fit``'s schedule is known once its model is built, before its plan is made.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfdist import strategies
from tfdist.cluster.task import Task
from tfdist.fitting.api import KerasClient
from tfdist.fitting.inputs import Source
from tfdist.runtime.placement import Placement

X = np.zeros((32, 4), "float32")
Y = np.zeros((32,), "int64")


def model_fn():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=2)
    return model


def test_the_schedule_of_tfdist_fit_is_known_after_build_before_the_plan():
    client = KerasClient(model_fn, Source.of(X, Y), None, batch_size=8, epochs=3, validation_freq=1,
                         steps_per_epoch=None, validation_steps=None, shuffle=True, initial_epoch=0, callbacks=None,
                         verbose=0, class_weight=None, seed=None, connect_timeout=5.0)
    placement = Placement(strategy="one_device", traits=strategies.traits("one_device"), task=Task.local())
    client.prepare(tf.distribute.get_strategy(), placement)
    client.build()
    schedule = client.schedule()
    assert (schedule.total_steps, schedule.steps_per_epoch, schedule.steps_per_loop) == (12, 4, 2)
    assert (schedule.log_every, schedule.checkpoint_every, schedule.grow) == (4, 4, True)
    assert "12 steps (4 an epoch)" in client.banner(placement, 1, schedule)
