"""``python tests/helpers/stalled_input.py N [tfdist.train flags]``: ``tfdist.train`` whose training input stops after N batches.

For the progress watchdog's tests (tests/cluster/test_watchdog.py): the first N
batches of this process's training pipeline come as always, the next one
waits an hour inside the pipeline (a ``tf.py_function`` that sleeps), as a
pipeline reading from a storage that stopped answering would.
"""

import sys
import time

import tfdist.train  # noqa: F401 - sets TF_CPP_MIN_LOG_LEVEL before TensorFlow is imported
from tfdist.segmentation import plan


def stalled(after: int):
    import tensorflow as tf

    original = plan.train_dataset_fn

    def train_dataset_fn(*args, **kwargs):
        fn = original(*args, **kwargs)

        def wait(*batch):
            slept = tf.py_function(lambda: time.sleep(3600) or 0, [], tf.int64)
            with tf.control_dependencies([slept]):
                return tuple(tf.identity(t) for t in batch)

        return lambda context: fn(context).take(after).concatenate(fn(context).skip(after).map(wait))

    return train_dataset_fn


if __name__ == "__main__":
    plan.train_dataset_fn = stalled(int(sys.argv.pop(1)))
    tfdist.train.entry()
