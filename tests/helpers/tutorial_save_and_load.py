"""TensorFlow's tutorial "Save and load a model using a distribution strategy", compact (random images for MNIST),
with ``strategy = tfdist.setup()`` as its strategy's line (argv: the folder it works in, as the tutorial works in its
own). Every reload must predict what was saved; one ``RESULTS`` line says which did.

The tutorial loads under a second strategy (``tf.distribute.OneDeviceStrategy``); a process across workers has
one, so this loads in the first one's scope.
"""

import json
import os
import sys

import tfdist

strategy = tfdist.setup()  # was: mirrored_strategy = tf.distribute.MirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

os.makedirs(sys.argv[1], exist_ok=True)
os.chdir(sys.argv[1])  # the tutorial's paths are relative: every worker names the same files


def get_data():
    rng = np.random.default_rng(0)
    images = rng.random((256, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, 256)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(64), images[:32]


def get_model():
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=keras.optimizers.Adam(), metrics=[keras.metrics.SparseCategoricalAccuracy()])
    return model


model = get_model()
train_dataset, test_images = get_data()
model.fit(train_dataset, epochs=2, verbose=0)
expected = model(test_images).numpy()


def same(predicted) -> bool:
    return bool(np.allclose(np.asarray(predicted), expected, atol=1e-5))


ok = {}
keras_model_path = "keras_save.keras"
model.save(keras_model_path)
restored_keras_model = keras.models.load_model(keras_model_path)
ok["load_model"] = same(restored_keras_model(test_images))
restored_keras_model.fit(train_dataset, epochs=2, verbose=0)

with strategy.scope():
    restored_keras_model_ds = keras.models.load_model(keras_model_path)
    ok["load_model in the scope"] = same(restored_keras_model_ds(test_images))
    restored_keras_model_ds.fit(train_dataset, epochs=2, verbose=0)

saved_model_path = "tf_save"
tf.saved_model.save(model, saved_model_path)
loaded = tf.saved_model.load(saved_model_path)
inference_func = loaded.signatures[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
ok["tf.saved_model.load"] = same(list(inference_func(tf.constant(test_images)).values())[0])

model.export("exported")  # Keras 3's SavedModel for serving
served = tf.saved_model.load("exported")
ok["export"] = same(served.serve(test_images))
print("RESULTS " + json.dumps(ok), flush=True)
