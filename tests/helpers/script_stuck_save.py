"""A save every worker makes while the chief, alive, is stuck inside it (argv: the folder, the seconds it is stuck).

``tfdist.setup(progress_timeout=5)``; the model's last layer holds the chief's save of its weights for the given
seconds (a save onto a stalled disk), so every other worker, which returns from a save only once the chief's
file is whole, waits for it until the progress timeout ends it.
"""

import os
import sys
import time

import tfdist

strategy = tfdist.setup(progress_timeout=5)

import keras  # noqa: E402

chief = strategy.extended.should_checkpoint


class Stuck(keras.layers.Layer):
    """A layer whose save holds the chief for ``sys.argv[2]`` seconds."""

    def save_own_variables(self, store):
        if chief:
            time.sleep(float(sys.argv[2]))
        super().save_own_variables(store)


with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), Stuck()])
model.save(os.path.join(sys.argv[1], "stuck.keras"))
print("SAVED", flush=True)
