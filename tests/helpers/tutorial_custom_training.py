"""TensorFlow's tutorial "Custom training with tf.distribute.Strategy", compact (random images for Fashion MNIST,
4 epochs), with ``strategy = tfdist.setup()`` as its strategy's line (argv: the folder it works in). It saves a
checkpoint every other epoch with ``checkpoint.save(checkpoint_prefix)`` on every worker, then restores the latest
one into a new model; one ``RESULTS`` line says whether that model predicts what was saved.
"""

import json
import os
import sys

import tfdist

strategy = tfdist.setup()  # was: strategy = tf.distribute.MirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

os.makedirs(sys.argv[1], exist_ok=True)
os.chdir(sys.argv[1])

rng = np.random.default_rng(0)
train_images = rng.random((256, 28, 28, 1), dtype=np.float32)
train_labels = rng.integers(0, 10, 256)
test_images = train_images[:64]
BATCH_SIZE_PER_REPLICA = 32
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = 4

train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)


def create_model():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10),
    ])


checkpoint_dir = "./training_checkpoints"
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")

with strategy.scope():
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def compute_loss(labels, predictions):
        return tf.nn.compute_average_loss(loss_object(labels, predictions), global_batch_size=GLOBAL_BATCH_SIZE)

    model = create_model()
    optimizer = keras.optimizers.Adam(learning_rate=0.001)
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        loss = compute_loss(labels, model(images, training=True))
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


for epoch in range(EPOCHS):
    total_loss, num_batches = 0.0, 0
    for x in train_dist_dataset:
        total_loss += distributed_train_step(x)
        num_batches += 1
    if epoch % 2 == 0:
        checkpoint.save(checkpoint_prefix)
        saved = model(test_images).numpy()  # what the latest checkpoint holds

new_model = create_model()
new_optimizer = keras.optimizers.Adam()
checkpoint = tf.train.Checkpoint(optimizer=new_optimizer, model=new_model)
latest = tf.train.latest_checkpoint(checkpoint_dir)
checkpoint.restore(latest)
print("RESULTS " + json.dumps({"latest is ckpt-2": latest == os.path.join(checkpoint_dir, "ckpt-2"),
                               "restored": bool(np.allclose(new_model(test_images).numpy(), saved, atol=1e-5))}),
      flush=True)
