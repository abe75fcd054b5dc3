"""Profile: tfdist's train step against Keras' own, in one process, in alternating blocks.

The benchmark's ``one_device`` and ``keras_fit`` rows differ by more than the
machine's noise allows to read (single rows move 20-30% here). This takes the
loops, processes and epochs out and times only the step, on the benchmark's
model and batch (32x32, 3 levels, 16 base filters, global batch 16), over
cached tensors:

- ``tfdist``: ``Steps.train`` (forward, backward, Adam, and the stats vector
  of loss and confusion matrix that tfdist's metrics are made of);
- ``tfdist_no_stats``: the same without the stats vector;
- ``keras``: the ``train_function`` that ``model.fit`` calls once per step.

Run: ``python examples/profile_train_step.py`` (1-2 minutes on 2 cores). Each block
starts with another function in turn: a fixed order favoured the last one by
2-4% here.
"""

import argparse
import time

import keras
import numpy as np
import tensorflow as tf

from tfdist.data import generate_shapes
from tfdist.models import build_unet
from tfdist.segmentation.steps import Steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6, help="alternating blocks per step function")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    args = parser.parse_args()

    batch = 16
    images, masks = generate_shapes(batch * 8, 32, 0)
    data = tf.data.Dataset.from_tensor_slices((images.astype(np.float32) / 255.0, masks.astype(np.int32)))
    data = data.batch(batch).cache().repeat()

    def model():
        return build_unet(image_size=32, num_classes=4, base_filters=16, depth=3)

    with_stats = Steps(model=model(), optimizer=keras.optimizers.Adam(2e-3), num_classes=4, global_batch_size=batch)
    no_stats = Steps(model=model(), optimizer=keras.optimizers.Adam(2e-3), num_classes=4, global_batch_size=batch)

    def without_stats(iterator):
        images, masks = next(iterator)
        grads, _, per_image = no_stats._gradients(images, masks)
        no_stats.optimizer.apply(grads, no_stats.model.trainable_variables)
        return tf.reduce_sum(per_image)

    plain = model()
    plain.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plain.make_train_function()  # sets plain.train_function
    functions = {
        "tfdist": (tf.function(lambda iterator: with_stats.train(next(iterator))), iter(data)),
        "tfdist_no_stats": (tf.function(without_stats), iter(data)),
        "keras": (plain.train_function, iter(data)),
    }

    def call(name):
        function, iterator = functions[name]
        result = function(iterator)
        tf.nest.map_structure(lambda t: t.numpy(), result)  # wait for the step, as both loops do

    for name in functions:  # trace and warm up
        for _ in range(3):
            call(name)
    seconds = dict.fromkeys(functions, 0.0)
    names = list(functions)
    for block in range(args.blocks):
        for name in names[block % len(names):] + names[:block % len(names)]:  # each goes first in turn
            start = time.perf_counter()
            for _ in range(args.steps):
                call(name)
            seconds[name] += time.perf_counter() - start
    images_per_second = {name: args.blocks * args.steps * batch / s for name, s in seconds.items()}
    for name, ips in images_per_second.items():
        print(f"{name:>16}: {ips:6.1f} images/s  ({ips / images_per_second['keras']:.3f}x keras)")


if __name__ == "__main__":
    main()
