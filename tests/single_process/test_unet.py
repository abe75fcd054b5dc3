"""The UNet: shapes, mixed precision, clear errors, batch norm equal on N replicas, and the --norm choices."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import UserError
from tfdist.models import LocalBatchNorm, ReplicaBatchNorm, build_unet


@pytest.mark.parametrize("depth, size", [(2, 32), (3, 48), (4, 64)])
def test_logits_have_one_channel_per_class(depth, size):
    model = build_unet(image_size=size, num_classes=5, base_filters=4, depth=depth)
    out = model(np.zeros((2, size, size, 3), np.float32))
    assert out.shape == (2, size, size, 5)


def test_options_change_the_model():
    plain = build_unet(image_size=32, depth=2, base_filters=4, batch_norm=False)
    assert not any(isinstance(layer, ReplicaBatchNorm) for layer in plain.layers)
    dropped = build_unet(image_size=32, depth=2, base_filters=4, dropout=0.3)
    assert any(isinstance(layer, keras.layers.Dropout) for layer in dropped.layers)
    wider = build_unet(image_size=32, depth=2, base_filters=8)
    assert wider.count_params() > build_unet(image_size=32, depth=2, base_filters=4).count_params()


NORM_LAYERS = {"batch": ReplicaBatchNorm, "group": keras.layers.GroupNormalization, "replica_batch": LocalBatchNorm}


def _norm_layers(model):
    return [layer for layer in model.layers if isinstance(layer, (keras.layers.BatchNormalization,
                                                                  keras.layers.GroupNormalization))]


@pytest.mark.parametrize("norm", ["batch", "group", "replica_batch", "none"])
def test_norm_picks_the_layer_after_every_convolution(norm):
    """A conv has a bias exactly when no normalization (with its learned offset) follows; group norm's
    groups divide the channels, at most 8 (4 channels: 4 groups)."""
    model = build_unet(image_size=32, depth=2, base_filters=4, norm=norm)
    convs = [layer for layer in model.layers if type(layer) is keras.layers.Conv2D and layer.name != "logits_conv"]
    layers = _norm_layers(model)
    assert len(convs) == 10 and all(conv.use_bias == (norm == "none") for conv in convs)
    if norm == "none":
        assert layers == []
        return
    assert len(layers) == len(convs) and {type(layer) for layer in layers} == {NORM_LAYERS[norm]}
    if norm == "group":
        assert [layer.groups for layer in layers[:6]] == [4, 4, 8, 8, 8, 8]  # 4, 4, 8, 8, 16, 16 channels


def test_nobatch_norm_is_no_normalization_and_refuses_another_norm():
    plain = build_unet(image_size=32, depth=2, base_filters=4, batch_norm=False)
    assert _norm_layers(plain) == [] and plain.get_layer("down0_conv1").use_bias
    with pytest.raises(UserError, match=r"norm='group' and batch_norm=False"):
        build_unet(image_size=32, depth=2, base_filters=4, batch_norm=False, norm="group")
    with pytest.raises(UserError, match=r"norm='layer'.*Expected one of: batch, group, replica_batch, none"):
        build_unet(image_size=32, depth=2, base_filters=4, norm="layer")


def test_mobilenetv2_encoder_builds_without_download():
    model = build_unet(image_size=64, num_classes=3, base_filters=8, encoder="mobilenetv2", norm="group")
    assert model.output_shape == (None, 64, 64, 3)
    assert any(layer.name == "mobilenetv2_encoder" for layer in model.layers)
    # --norm reaches the decoder: a group norm after each of its convolutions, none of tfdist's batch norms.
    assert len(_norm_layers(model)) == 9 and not any(isinstance(layer, ReplicaBatchNorm) for layer in model.layers)
    assert not model.get_layer("up0_conv1").use_bias


def test_mixed_precision_keeps_logits_float32():
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = build_unet(image_size=32, depth=2, base_filters=4)
        out = model(np.zeros((1, 32, 32, 3), np.float32))
        assert out.dtype == "float32"
        assert model.get_layer("down0_conv1").compute_dtype == "float16"
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"image_size": 60, "depth": 4}, r"image_size=60 with depth=4.*2\*\*depth=16"),
        ({"num_classes": 1}, r"num_classes=1"),
        ({"encoder": "resnet"}, r"encoder='resnet'"),
        ({"encoder": "mobilenetv2", "image_size": 48, "depth": 4}, r"multiple of 32"),
    ],
)
def test_invalid_sizes_fail_clearly(kwargs, match):
    with pytest.raises(UserError, match=match):
        build_unet(**kwargs)


@pytest.mark.parametrize("norm", ["batch", "group", "replica_batch"])
def test_saved_and_loaded_model_predicts_the_same(tmp_path, norm):
    model = build_unet(image_size=32, depth=2, base_filters=4, norm=norm)
    x = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded(x), model(x), rtol=1e-5, atol=1e-5)


def _bn_forward(strategy, x, layer_class=ReplicaBatchNorm):
    with strategy.scope():
        keras.utils.set_random_seed(1)
        layer = layer_class()
        layer.build(x.shape)

    @tf.function
    def replica_fn(batch):
        return layer(batch, training=True)

    # One global batch of len(x), split across the replicas in order.
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(len(x))
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    outputs = strategy.experimental_local_results(strategy.run(replica_fn, args=(batch,)))
    return np.concatenate([np.asarray(o) for o in outputs]), layer


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_batch_norm_on_two_replicas_equals_one_device(name):
    from tfdist.strategies import make_strategy

    x = np.random.default_rng(0).normal(size=(8, 4, 4, 3)).astype(np.float32) * np.arange(1, 9).reshape(8, 1, 1, 1)
    one, one_layer = _bn_forward(make_strategy("one_device"), x)
    two, two_layer = _bn_forward(make_strategy(name, cpu_devices=2), x)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(two_layer.moving_mean.numpy(), one_layer.moving_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        two_layer.moving_variance.numpy(), one_layer.moving_variance.numpy(), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_local_batch_norm_on_two_replicas_normalizes_each_slice_on_its_own(name):
    """--norm replica_batch: each replica normalizes its own half of the global batch (so, unlike one device,
    no all-reduce of the statistics), and under central_storage too the moving statistics update: towards
    the replicas' mean of the slice statistics (aggregation "mean")."""
    from tfdist.strategies import make_strategy

    x = np.random.default_rng(0).normal(size=(8, 4, 4, 3)).astype(np.float32) * np.arange(1, 9).reshape(8, 1, 1, 1)
    one, one_layer = _bn_forward(make_strategy("one_device"), x, LocalBatchNorm)
    two, two_layer = _bn_forward(make_strategy(name, cpu_devices=2), x, LocalBatchNorm)
    assert not np.allclose(two, one, rtol=1e-3, atol=1e-3)  # it did not synchronize the statistics
    halves = [_bn_forward(make_strategy("one_device"), half, LocalBatchNorm) for half in (x[:4], x[4:])]
    np.testing.assert_allclose(two, np.concatenate([out for out, _ in halves]), rtol=1e-5, atol=1e-5)
    for stat in ("moving_mean", "moving_variance"):
        expected = np.mean([getattr(layer, stat).numpy() for _, layer in halves], axis=0)
        np.testing.assert_allclose(getattr(two_layer, stat).numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(two_layer.moving_mean.numpy(), 0.0)  # the call did update them
    assert not np.allclose(two_layer.moving_variance.numpy(), one_layer.moving_variance.numpy(), rtol=1e-3)


def test_replica_batch_norm_on_one_device_is_keras_batch_normalization():
    """The reference for the batch norm of N replicas: on one device ReplicaBatchNorm is Keras'
    BatchNormalization with momentum 0.9 (its documented default): the same training-mode outputs, the same
    moving statistics after the call, and the same inference outputs from them."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(8, 4, 4, 3)) * [1.0, 2.0, 0.5] + [3.0, -1.0, 0.0]).astype(np.float32)
    ours, keras_bn = ReplicaBatchNorm(), keras.layers.BatchNormalization(momentum=0.9)
    for layer in (ours, keras_bn):
        layer.build(x.shape)
    start = [rng.normal(size=w.shape).astype(np.float32) for w in ours.get_weights()]
    start[3] = np.abs(start[3]) + 0.5  # a moving variance
    ours.set_weights(start)
    keras_bn.set_weights(start)
    assert [w.path.split("/")[-1] for w in ours.weights] == ["gamma", "beta", "moving_mean", "moving_variance"]
    np.testing.assert_allclose(ours(x, training=True), keras_bn(x, training=True), rtol=1e-5, atol=1e-5)
    for a, b in zip(ours.get_weights(), keras_bn.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours.moving_mean.numpy(), start[2])  # the call did update them
    np.testing.assert_allclose(ours(x, training=False), keras_bn(x, training=False), rtol=1e-5, atol=1e-5)


def _train_moving_statistics(strategy, images, masks, steps=3):
    """Moving statistics of every ReplicaBatchNorm after ``steps`` real train steps (``Steps.train``) on the
    same global batches, and the eval-mode logits of the last batch, computed on the replicas."""
    from tfdist.segmentation.steps import Steps

    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = build_unet(image_size=16, num_classes=3, base_filters=4, depth=1)
        optimizer = keras.optimizers.SGD(0.1)
    train = Steps(model=model, optimizer=optimizer, num_classes=3, global_batch_size=len(images))
    data = tf.data.Dataset.from_tensor_slices((images, masks)).batch(len(images)).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(data))

    @tf.function
    def step():
        strategy.run(train.train, args=(next(iterator),))

    @tf.function
    def predict(batch):
        return strategy.run(lambda b: model(b[0], training=False), args=(batch,))

    for _ in range(steps):
        step()
    logits = np.concatenate([np.asarray(t) for t in strategy.experimental_local_results(predict(next(iterator)))])
    layers = [layer for layer in model.layers if isinstance(layer, ReplicaBatchNorm)]
    return layers, [v.numpy() for layer in layers for v in (layer.moving_mean, layer.moving_variance)], logits


def test_moving_statistics_update_on_read_without_collective_and_equal_one_device():
    """Under mirrored the moving statistics are on-read copies (each replica assigns its own, no all-reduce:
    the batch statistics they come from are already synchronized), read from the first replica; after a few
    train steps on 2 replicas they equal one device's on the same global batches, every replica's copy is
    the same, and eval (which reads them on each replica) predicts what one device predicts."""
    from tfdist.strategies import make_strategy

    rng = np.random.default_rng(0)
    images = (rng.random((8, 16, 16, 3)) * np.arange(1, 9).reshape(8, 1, 1, 1)).astype(np.float32)
    masks = rng.integers(0, 3, size=(8, 16, 16, 1)).astype(np.int32)
    _, one, one_logits = _train_moving_statistics(make_strategy("one_device"), images, masks)
    layers, two, two_logits = _train_moving_statistics(make_strategy("mirrored", cpu_devices=2), images, masks)
    for layer in layers:
        for variable in (layer.moving_mean, layer.moving_variance):
            assert variable.value.synchronization == tf.VariableSynchronization.ON_READ
            assert variable.value.aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA
            first, second = (np.asarray(v) for v in variable.value.values)
            np.testing.assert_array_equal(first, second)
        assert layer.gamma.value.synchronization != tf.VariableSynchronization.ON_READ
    assert len(two) == 2 * 6 and not np.allclose(two[0], 0.0)  # 6 batch norms; the steps did update them
    for a, b in zip(two, one):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two_logits, one_logits, rtol=1e-4, atol=1e-5)
