"""``tfdist.fit`` under ``parameter_server`` with Keras' global seed 0, over an in-process cluster.

Runs in a fresh process (connecting to a cluster changes the process's
TensorFlow context): 2 workers and a ps as in-process gRPC servers on
127.0.0.1 (``tfdist.deploy.in_process.in_process_cluster``), this process the
coordinator.

- With the global seed 0 (``keras.utils.set_random_seed(0)``), the
  per-worker input order (``inputs.per_worker_order``) is traced without a
  tensor reaching ``Dataset.shuffle``'s seed (TensorFlow compared it as a
  Python bool there), and the two workers still read different batches.
- ``tfdist.fit(..., strategy="parameter_server", seed=0)`` trains the Keras
  guides' classifier: its held-out accuracy ends far above chance.
- Keras' own ``evaluate`` and ``predict`` of the model it returns equal one device's of the same weights
  (the coordinator runs them, reading the variables on the ps task).

A model with its own ``train_step`` is refused there with one line (``test_fit_bad_inputs.py``).
"""

from __future__ import annotations

import pytest

from helpers.outputs import tagged

SCRIPT = r"""
import json, os, sys
os.environ["GRPC_FAIL_FAST"] = "use_caller"
sys.path.insert(0, sys.argv[1])
from tfdist.strategies import setup_host
setup_host(inter_op_threads=4)
import keras, tensorflow as tf
import tfdist
from tfdist.deploy.in_process import in_process_cluster
from tfdist.engine.inputs import per_worker_order
from fit_classifier import make_data, model_fn

resolver = in_process_cluster(num_workers=2, num_ps=1)
out = {}
keras.utils.set_random_seed(0)
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
fn = per_worker_order(lambda context: tf.data.Dataset.range(64).repeat())
iterator = iter(coordinator.create_per_worker_dataset(
    tf.function(lambda: strategy.distribute_datasets_from_function(fn))))


@tf.function
def first_eight(iterator):
    return (tf.stack([next(iterator) for _ in range(8)]),
            tf.distribute.coordinator.experimental_get_current_worker_index())


orders = {}
for _ in range(40):  # until both workers have run one closure
    values, worker = coordinator.schedule(first_eight, args=(iterator,)).fetch()
    orders.setdefault(str(int(worker)), [int(v) for v in values])
    if len(orders) == 2:
        break
out["orders"] = orders

x, y = make_data(1000, seed=0)
val = make_data(200, seed=1)
fitted = tfdist.fit(model_fn, x, y, batch_size=64, epochs=3, strategy="parameter_server", seed=0,
                    validation_data=val, verbose=0, cluster_resolver=resolver)
out["history"] = fitted.history
one_device = model_fn()
one_device.set_weights(fitted.model.get_weights())
out["evaluate"] = [fitted.model.evaluate(*val, batch_size=64, verbose=0, return_dict=True),
                   one_device.evaluate(*val, batch_size=64, verbose=0, return_dict=True)]
out["predict"] = float(abs(fitted.model.predict(val[0], verbose=0) - one_device.predict(val[0], verbose=0)).max())

print("RESULTS " + json.dumps(out))
"""


def test_parameter_server_with_seed_0_learns_and_workers_keep_their_own_order(python):
    from helpers.cluster_runs import REPO

    result = python(["-c", SCRIPT, str(REPO / "examples")], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tagged(result.stdout, "RESULTS")
    orders = out["orders"]
    assert sorted(orders) == ["0", "1"], orders
    assert sum(a != b for a, b in zip(orders["0"], orders["1"])) >= 6, orders  # another batch at most steps
    history = out["history"]
    assert len(history["loss"]) == 3 and history["loss"][-1] < history["loss"][0], history
    assert history["val_accuracy"][-1] > 0.3, history  # 10 classes: chance is 0.1
    got, expected = out["evaluate"]  # Keras' own evaluate and predict, run by the coordinator
    assert got == pytest.approx(expected, rel=1e-6), out["evaluate"]
    assert out["predict"] < 1e-6, out["predict"]
