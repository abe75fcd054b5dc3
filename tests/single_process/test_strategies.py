"""The strategy registry: names, replica counts, and parameter_server over real gRPC servers."""

import json

import pytest

from tfdist import strategies
from tfdist.errors import UserError


@pytest.mark.parametrize(
    "name, cpu_devices, replicas",
    [("one_device", 0, 1), ("mirrored", 2, 2), ("mirrored", 0, 2), ("central_storage", 2, 2), ("MIRRORED", 1, 1)],
)
def test_local_strategies_report_their_replicas(name, cpu_devices, replicas):
    strategy = strategies.make_strategy(name, cpu_devices=cpu_devices)
    assert strategy.num_replicas_in_sync == replicas


def test_central_storage_keeps_variables_on_the_cpu():
    import tensorflow as tf

    strategy = strategies.make_strategy("central_storage", cpu_devices=2)
    with strategy.scope():
        v = tf.Variable(1.0)
    assert "CPU:0" in v.device


def test_more_devices_than_the_runtime_has_is_a_clear_error():
    with pytest.raises(UserError, match=r"already initialised with 2"):
        strategies.make_strategy("mirrored", cpu_devices=3)


def test_communication_options_expose_packing_and_timeout():
    options = strategies.communication_options(communication="ring", bytes_per_pack=1 << 20, collective_timeout=5)
    assert options.bytes_per_pack == 1 << 20
    assert options.timeout_seconds == 5
    with pytest.raises(UserError, match="communication='mpi'"):
        strategies.communication_options(communication="mpi")


def test_single_worker_multi_worker_mirrored_has_one_replica(python):
    # A fresh process: collectives must be configured before any other op.
    result = python(
        "from tfdist.strategies import make_strategy; "
        "s = make_strategy('multi_worker_mirrored', bytes_per_pack=4 << 20); print(s.num_replicas_in_sync)",
        env={"TF_CONFIG": ""},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1"


SEVERAL_MIRRORED = r"""
import numpy as np, tensorflow as tf, tfdist
strategy = tfdist.setup("mirrored", cpu_devices=3)
import keras
print("DEVICES", strategy.num_replicas_in_sync, len(tf.config.list_logical_devices("CPU")))
x = np.random.default_rng(0).normal(size=(96, 5)).astype("float32")
y = x[:, :2].sum(axis=1, keepdims=True)

def make():  # synchronized batch norm: collectives inside the step
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5,))
    normalized = keras.layers.BatchNormalization(synchronized=True)(keras.layers.Dense(6, activation="tanh")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(normalized))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model

def trained(strategy=None):
    if strategy is None:
        model = make()
    else:
        with strategy.scope():
            model = make()
    model.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()

one = trained()
for made in (lambda: strategy, lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
             lambda: tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2"])):
    weights = trained(made())
    print("SPREAD", max(float(np.max(np.abs(a - b))) for a, b in zip(weights, one)), flush=True)
"""


def test_cpu_devices_split_a_fresh_process_whose_mirrored_strategies_each_train_as_one_device(python):
    # tfdist.setup's 3 replicas, then MirroredStrategy objects over 2 of the devices: each numbers its collectives
    # from a base of its own, as TensorFlow's own tests make them (alike, the second one's collectives fail).
    result = python(SEVERAL_MIRRORED, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "DEVICES 3 3" in lines
    spreads = [float(line.split()[1]) for line in lines if line.startswith("SPREAD")]
    assert len(spreads) == 3 and max(spreads) < 2e-7, spreads


PS_SCRIPT = r"""
import json, os
os.environ["GRPC_FAIL_FAST"] = "use_caller"
import tensorflow as tf
from tfdist.deploy.in_process import in_process_cluster
from tfdist.strategies import make_strategy
resolver = in_process_cluster(num_workers=2, num_ps=2)
s = make_strategy("parameter_server", cluster_resolver=resolver)
with s.scope():
    v = tf.Variable(tf.zeros([64]))
    w = tf.Variable(1.0)
print(json.dumps({"replicas": s.num_replicas_in_sync, "workers": s.extended._num_workers,
                  "devices": [v.device, w.device], "sharded": hasattr(v, "variables")}))
"""


def test_parameter_server_builds_over_real_servers(python):
    result = python(PS_SCRIPT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["workers"] == 2
    # whole variables (no partitioner), placed round-robin: one on each ps task
    assert [d.split("/device:")[0] for d in report["devices"]] == ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]
    assert report["sharded"] is False


def test_parameter_server_refuses_a_cluster_without_ps():
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["127.0.0.1:1"]}), rpc_layer="grpc"
    )
    with pytest.raises(UserError, match="without `ps` tasks"):
        strategies.make_strategy("parameter_server", cluster_resolver=resolver)


def test_auto_reads_an_in_process_resolvers_cluster():
    import tensorflow as tf

    from tfdist import config as config_lib

    def resolver(tasks):
        return tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(tasks))

    auto = config_lib.RuntimeConfig()
    mwm = resolver({"worker": ["127.0.0.1:1", "127.0.0.1:2"]})
    ps = resolver({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]})
    assert config_lib.resolve_strategy(auto, mwm).strategy == "multi_worker_mirrored"
    assert config_lib.resolve_strategy(auto, ps).strategy == "parameter_server"
