"""Models tfdist trains: the UNet and its MobileNetV2-encoder variant.

Its names are read from ``unet`` when first asked for, so that ``norms`` is read without starting Keras;
importing ``tfdist.models.unet`` registers the UNet's layers for ``keras.models.load_model``.
"""

_UNET = ("LocalBatchNorm", "ReplicaBatchNorm", "build_from_config", "build_unet")


def __getattr__(name: str):
    if name in _UNET:
        from tfdist.models import unet

        return getattr(unet, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_UNET)
