"""Models tfdist trains: the UNet and its MobileNetV2-encoder variant."""

from tfdist.models.unet import LocalBatchNorm, ReplicaBatchNorm, build_from_config, build_unet

__all__ = ["LocalBatchNorm", "ReplicaBatchNorm", "build_from_config", "build_unet"]
