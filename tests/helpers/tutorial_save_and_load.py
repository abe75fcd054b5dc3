"""TensorFlow's tutorial "Save and load a model using a distribution strategy", compact (random images for MNIST),
with ``strategy = tfdist.setup()`` as its strategy's line (argv: the folder it works in, as the tutorial works in its
own). Every reload must predict what was saved, and train where the tutorial trains it; one ``RESULTS`` line says
which did.

As the tutorial does, the Keras model loads and trains under ``another_strategy =
tf.distribute.OneDeviceStrategy('/cpu:0')``, and the SavedModel loads and predicts a distributed dataset under
``another_strategy = tf.distribute.MirroredStrategy()``, each built beside the session's strategy.
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

another_strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
with another_strategy.scope():
    restored_keras_model_ds = keras.models.load_model(keras_model_path)
    ok["load_model under OneDeviceStrategy"] = same(restored_keras_model_ds(test_images))
    history = restored_keras_model_ds.fit(train_dataset, epochs=2, verbose=0).history
    ok["fit under OneDeviceStrategy"] = len(history["loss"]) == 2 and bool(np.isfinite(history["loss"]).all())

saved_model_path = "tf_save"
tf.saved_model.save(model, saved_model_path)
loaded = tf.saved_model.load(saved_model_path)
inference_func = loaded.signatures[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
ok["tf.saved_model.load"] = same(list(inference_func(tf.constant(test_images)).values())[0])

predict_dataset = tf.data.Dataset.from_tensor_slices(test_images).batch(16)
another_strategy = tf.distribute.MirroredStrategy()
with another_strategy.scope():
    loaded = tf.saved_model.load(saved_model_path)
    inference_func = loaded.signatures[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
    dist_predict_dataset = another_strategy.experimental_distribute_dataset(predict_dataset)
    predicted = [another_strategy.experimental_local_results(another_strategy.run(inference_func, args=(batch,)))
                 for batch in dist_predict_dataset]
ok["tf.saved_model.load under MirroredStrategy"] = same(np.concatenate(
    [list(part.values())[0] for parts in predicted for part in parts]))

model.export("exported")  # Keras 3's SavedModel for serving
served = tf.saved_model.load("exported")
ok["export"] = same(served.serve(test_images))
print("RESULTS " + json.dumps(ok), flush=True)
