"""A plain TensorFlow multi-worker script: no tfdist, it reads TF_CONFIG itself.

It is what a TensorFlow tutorial's multi-worker example looks like: a linear
regression trained by a custom loop under ``MultiWorkerMirroredStrategy``,
which reads the cluster and this task from the TF_CONFIG environment
variable. Run every task of a cluster on this machine with the tfdist
launcher, which sets each task's TF_CONFIG::

    python -m tfdist.launch --cluster configs/clusters/local_mwm.yaml --local -- \\
        python examples/plain_tf_multi_worker.py --steps 20

Every worker prints the same final weights (the gradients are all-reduced),
close to the true ones, ``[2, -3, 0.5]`` and ``1``.
"""

import argparse
import json
import os

import tensorflow as tf

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--global_batch_size", type=int, default=64)
parser.add_argument("--learning_rate", type=float, default=0.2)
args = parser.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
num_workers = sum(len(tf_config.get("cluster", {}).get(t, [])) for t in ("chief", "worker")) or 1
# On a machine with few cores, collectives hang unless the inter-op pool has
# a thread for every worker and one more (TensorFlow's own tests do this).
tf.config.threading.set_inter_op_parallelism_threads(num_workers + 1)

# The strategy comes first: collectives must be configured before any other op.
strategy = tf.distribute.MultiWorkerMirroredStrategy()
TRUE_W = tf.constant([[2.0], [-3.0], [0.5]])
TRUE_B = 1.0

with strategy.scope():
    w = tf.Variable(tf.zeros([3, 1]), name="w")
    b = tf.Variable(0.0, name="b")


def dataset_fn(context):
    """The same 1024 examples on every worker, each worker reading its own shard of every global batch."""
    x = tf.random.stateless_normal([1024, 3], seed=[1, 2])
    y = x @ TRUE_W + TRUE_B
    batch = context.get_per_replica_batch_size(args.global_batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)


iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))


@tf.function
def train_step(iterator):
    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.square(x @ w + b - y)[:, 0]
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.global_batch_size)
        grads = tape.gradient(loss, [w, b])
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        w.assign_sub(args.learning_rate * grads[0])
        b.assign_sub(args.learning_rate * grads[1])
        return loss

    per_replica = strategy.run(step, args=next(iterator))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


task = tf_config.get("task", {"type": "worker", "index": 0})
for i in range(args.steps):
    loss = float(train_step(iterator))
    if i == 0 or i == args.steps - 1:
        print(f"step {i + 1}: loss {loss:.6f}", flush=True)
weights = [round(float(v), 6) for v in w.numpy().ravel()] + [round(float(b.numpy()), 6)]
print(f"{task['type']}:{task['index']} of {num_workers} workers: final weights {json.dumps(weights)}", flush=True)
