"""The UNet (Ronneberger et al.), and a MobileNetV2-encoder variant, with a choice of normalization (``norm``)."""

from __future__ import annotations

import keras

from tfdist.errors import UserError
from tfdist.models.norms import resolve_norm
from tfdist.strategies import traits_of

#: Groups of ``GroupNormalization``: the largest divisor of the channels up to this.
MAX_GROUPS = 8


class _MeanMovingStatistics(keras.layers.BatchNormalization):
    """Batch norm whose moving statistics are created with aggregation "mean", momentum 0.9."""

    def __init__(self, momentum: float = 0.9, **kwargs):
        kwargs.pop("synchronized", None)
        super().__init__(momentum=momentum, **kwargs)

    def add_weight(self, *args, **kwargs):
        if kwargs.get("name") in _MOVING:
            kwargs.setdefault("aggregation", "mean")
        return super().add_weight(*args, **kwargs)


_MOVING = ("moving_mean", "moving_variance")


def _moving_synchronization() -> str:
    """How ``ReplicaBatchNorm`` creates its moving statistics under the strategy in scope.

    ``"on_read"`` under MirroredStrategy and MultiWorkerMirroredStrategy: each
    replica assigns its own copy, with no collective, and the copies stay
    equal because the batch statistics they are updated from are already
    all-reduced. Aggregation ``ONLY_FIRST_REPLICA``: a read in cross-replica
    context (checkpoints, ``get_weights``, the chief's export) takes the first
    local copy, where ``"mean"`` would all-reduce identical copies, and under
    MultiWorkerMirroredStrategy hang when the chief alone reads them.
    ``"on_write"`` (aggregation "mean") elsewhere: one device, and
    CentralStorageStrategy and ParameterServerStrategy, whose variables are
    AggregatingVariables.
    """
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return "on_write"
    known = traits_of(tf.distribute.get_strategy())
    return "on_read" if known is not None and known.copies_on_replicas else "on_write"


@keras.saving.register_keras_serializable(package="tfdist")
class LocalBatchNorm(_MeanMovingStatistics):
    """Batch norm over each replica's own slice of the batch (``norm="replica_batch"``).

    On one device this is Keras' ``BatchNormalization`` with momentum 0.9. On N
    replicas each one normalizes with the mean and variance of its own slice,
    with no all-reduce of them forward or backward, so training differs from
    one device with the global batch: the price of skipping the collective.
    The moving statistics have aggregation "mean", so that a custom loop can
    update them under CentralStorageStrategy and ParameterServerStrategy, and
    mirrored copies stay equal: they move towards the replicas' mean of the
    slice statistics (the moving variance lacks the spread between slices).
    """


@keras.saving.register_keras_serializable(package="tfdist")
class ReplicaBatchNorm(_MeanMovingStatistics):
    """Batch norm whose statistics are the same on N replicas as on one device.

    The batch mean and variance come from one all-reduce of
    ``[sum, sum of squares, count]`` over the replicas in sync (Keras' own
    ``synchronized=True`` issues three all-reduces and a full-size count
    tensor, which costs this model much of its speed). With one
    replica the same formula runs without the all-reduce: Keras' two-pass
    statistics differ from it by enough float32 rounding to break the 1e-5
    equivalence of one device and N replicas. ``momentum`` defaults to
    0.9 (Keras: 0.99) so that the moving statistics follow the short runs
    tfdist is used for, which at 0.99 lag the weights in eval.
    """

    def add_weight(self, *args, **kwargs):
        """The moving statistics: on-read copies under the mirrored strategies (no collective to update)."""
        if kwargs.get("name") not in _MOVING or args or _moving_synchronization() != "on_read":
            return super().add_weight(*args, **kwargs)
        dtype = kwargs.get("dtype")
        # Layer.add_weight takes no `synchronization`: the same variable, made here with it.
        with keras.name_scope(self.name, caller=self):
            variable = keras.Variable(
                initializer=keras.initializers.get(kwargs.get("initializer") or "zeros"),
                shape=kwargs.get("shape") or (),
                dtype=keras.backend.standardize_dtype(dtype) if dtype is not None else self.variable_dtype,
                trainable=kwargs.get("trainable", True),
                autocast=kwargs.get("autocast", True),
                aggregation="only_first_replica",
                synchronization="on_read",
                name=kwargs["name"],
            )
        variable.regularizer = None
        variable.constraint = None
        variable.overwrite_with_gradient = False
        self._track_variable(variable)
        return variable

    def _moments(self, inputs, mask):
        import tensorflow as tf

        if mask is not None:
            return super()._moments(inputs, mask)
        x = tf.cast(inputs, tf.float32)  # statistics in float32, also under mixed precision
        axes = self._reduction_axes
        count = tf.cast(tf.size(x) // tf.shape(x)[self.axis], tf.float32)
        local = tf.concat([tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes), count[None]], axis=0)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            local = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
        channels = tf.shape(x)[self.axis]
        total = local[-1]
        mean = tf.math.divide_no_nan(local[:channels], total)
        variance = tf.maximum(tf.math.divide_no_nan(local[channels : 2 * channels], total) - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)


def _groups(channels: int) -> int:
    """The largest divisor of ``channels`` up to ``MAX_GROUPS``.

    Wu & He use 32 groups for ResNets of 64 and more channels; this UNet has
    16 channels at its first level by default (4 in the tests), where 32
    groups would not divide the channels at all. 8 groups of 2 or more
    channels keep group norm between layer norm (1 group) and instance norm
    (1 channel a group) at every level; narrower layers get fewer groups.
    """
    return max(g for g in range(1, min(MAX_GROUPS, channels) + 1) if channels % g == 0)


def _has_offset(norm: str) -> bool:
    """Whether the normalization ``norm`` learns an offset (beta), which makes a conv's bias redundant."""
    return norm != "none"


def _norm_act(x, norm: str, name: str):
    if norm == "batch":
        x = ReplicaBatchNorm(name=f"{name}_bn")(x)
    elif norm == "replica_batch":
        x = LocalBatchNorm(name=f"{name}_bn")(x)
    elif norm == "group":
        x = keras.layers.GroupNormalization(_groups(x.shape[-1]), name=f"{name}_gn")(x)
    return keras.layers.Activation("relu", name=f"{name}_relu")(x)


def _double_conv(x, filters: int, norm: str, dropout: float, name: str):
    """Two 3x3 convolutions, each followed by (a normalization and) ReLU."""
    for i in (1, 2):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=not _has_offset(norm), name=f"{name}_conv{i}")(x)
        x = _norm_act(x, norm, f"{name}_{i}")
    if dropout:
        x = keras.layers.Dropout(dropout, name=f"{name}_dropout")(x)
    return x


def _up(x, skip, filters: int, norm: str, dropout: float, name: str):
    """Upsample by 2, concatenate the skip connection, then a double conv."""
    x = keras.layers.Conv2DTranspose(filters, 2, strides=2, padding="same", name=f"{name}_upconv")(x)
    x = keras.layers.Concatenate(name=f"{name}_concat")([x, skip])
    return _double_conv(x, filters, norm, dropout, name)


def _head(x, num_classes: int):
    """1x1 convolution to per-pixel logits, kept float32 under mixed precision."""
    x = keras.layers.Conv2D(num_classes, 1, name="logits_conv")(x)
    return keras.layers.Activation("linear", dtype="float32", name="logits")(x)


def _check(image_size: int, num_classes: int, depth: int, channels: int) -> None:
    if num_classes < 2:
        raise UserError("Invalid value for `num_classes`. "
                        f"Received: num_classes={num_classes}. Expected an integer >= 2.")
    if depth < 1:
        raise UserError(f"Invalid value for `depth`. Received: depth={depth}. Expected an integer >= 1.")
    if channels < 1:
        raise UserError(f"Invalid value for `channels`. Received: channels={channels}. Expected an integer >= 1.")
    if image_size < 2**depth or image_size % (2**depth):
        raise UserError(
            f"Invalid value for `image_size`. Received: image_size={image_size} with depth={depth}. "
            f"Expected a positive multiple of 2**depth={2**depth}."
        )


def _classic(inputs, *, num_classes, base_filters, depth, norm, dropout):
    x, skips = inputs, []
    for level in range(depth):
        x = _double_conv(x, base_filters * 2**level, norm, 0.0, f"down{level}")
        skips.append(x)
        x = keras.layers.MaxPooling2D(2, name=f"down{level}_pool")(x)
    x = _double_conv(x, base_filters * 2**depth, norm, dropout, "bottleneck")
    for level in reversed(range(depth)):
        x = _up(x, skips[level], base_filters * 2**level, norm, 0.0, f"up{level}")
    return _head(x, num_classes)


#: MobileNetV2 activations used as skips, from 1/2 to 1/16 resolution, and the 1/32 bottleneck.
_MOBILENET_SKIPS = ("block_1_expand_relu", "block_3_expand_relu", "block_6_expand_relu", "block_13_expand_relu")
_MOBILENET_BOTTLENECK = "block_16_project"


def _mobilenet(inputs, *, image_size, num_classes, base_filters, norm, dropout, weights):
    """MobileNetV2 encoder with upsampling blocks, as in TensorFlow's segmentation tutorial."""
    if image_size % 32 or image_size < 32:
        raise UserError(
            f"Invalid value for `image_size` with encoder=mobilenetv2. Received: image_size={image_size}. "
            "Expected a multiple of 32."
        )
    scaled = keras.layers.Rescaling(2.0, offset=-1.0, name="to_mobilenet_range")(inputs)
    base = keras.applications.MobileNetV2(
        input_shape=(image_size, image_size, 3), include_top=False, weights=weights or None
    )
    encoder = keras.Model(
        base.input,
        [base.get_layer(n).output for n in _MOBILENET_SKIPS] + [base.get_layer(_MOBILENET_BOTTLENECK).output],
        name="mobilenetv2_encoder",
    )
    *skips, x = encoder(scaled)
    for level in reversed(range(len(skips))):
        x = _up(x, skips[level], base_filters * 2**level, norm, dropout if level == len(skips) - 1 else 0.0,
                f"up{level}")
    x = keras.layers.Conv2DTranspose(base_filters, 2, strides=2, padding="same", name="up_full")(x)
    x = _norm_act(x, norm, "up_full")
    return _head(x, num_classes)


def build_unet(
    *,
    image_size: int = 64,
    num_classes: int = 4,
    channels: int = 3,
    base_filters: int = 16,
    depth: int = 4,
    batch_norm: bool = True,
    norm: str = "batch",
    dropout: float = 0.0,
    encoder: str = "unet",
    encoder_weights: str | None = None,
) -> keras.Model:
    """Build a UNet that maps ``[B, S, S, channels]`` images in [0, 1] to ``[B, S, S, num_classes]`` logits.

    Args:
      image_size: side of the square input; a multiple of ``2**depth``
        (of 32 for ``encoder="mobilenetv2"``).
      num_classes: classes per pixel (>= 2).
      channels: input channels (3 for ``mobilenetv2``).
      base_filters: filters of the first level, doubled at each level down.
      depth: number of downsampling levels (classic encoder).
      batch_norm: False means no normalization (``norm="none"``); with a
        normalizing ``norm`` other than the default ``"batch"`` it is an error.
      norm: the normalization after every convolution: ``"batch"``
        (``ReplicaBatchNorm``, exact), ``"group"`` (``GroupNormalization``,
        exact, no collective), ``"replica_batch"`` (``LocalBatchNorm``, each
        replica's own statistics) or ``"none"`` (see the module docstring).
      dropout: dropout rate at the bottleneck.
      encoder: ``"unet"`` (classic) or ``"mobilenetv2"`` (``keras.applications``).
      encoder_weights: a local MobileNetV2 weights file; None or "" means random
        initialisation (nothing is ever downloaded).

    Raises:
      UserError: invalid sizes, class count, encoder or norm name, or batch_norm=False with a
        normalizing norm.
    """
    _check(image_size, num_classes, depth, channels)
    norm = resolve_norm(norm, batch_norm)
    inputs = keras.Input((image_size, image_size, channels), name="image")
    if encoder == "unet":
        outputs = _classic(inputs, num_classes=num_classes, base_filters=base_filters, depth=depth,
                           norm=norm, dropout=dropout)
    elif encoder == "mobilenetv2":
        if channels != 3:
            raise UserError("Invalid value for `channels` with encoder=mobilenetv2. "
                            f"Received: channels={channels}. Expected 3.")
        outputs = _mobilenet(inputs, image_size=image_size, num_classes=num_classes, base_filters=base_filters,
                             norm=norm, dropout=dropout, weights=encoder_weights)
    else:
        raise UserError("Invalid value for `encoder`. "
                        f"Received: encoder={encoder!r}. Expected one of: unet, mobilenetv2.")
    return keras.Model(inputs, outputs, name=f"unet_{encoder}")


def build_from_config(model_config, data_config) -> keras.Model:
    """``build_unet`` from tfdist's ``ModelConfig`` and ``DataConfig``."""
    return build_unet(
        image_size=data_config.image_size,
        num_classes=data_config.num_classes,
        base_filters=model_config.base_filters,
        depth=model_config.depth,
        batch_norm=model_config.batch_norm,
        norm=model_config.norm,
        dropout=model_config.dropout,
        encoder=model_config.encoder,
        encoder_weights=model_config.encoder_weights or None,
    )
