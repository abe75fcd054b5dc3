"""tfdist: train a UNet segmentation model with any tf.distribute strategy on Keras 3.

The package is split by idea (see DESIGN.md): ``cluster`` turns a cluster spec
into TF_CONFIG, ``strategies`` builds a strategy by name, ``models`` and
``data`` give the model and the input pipelines, ``training`` owns the one
distributed loop, and ``train``/``tfconfig``/``launch``/``bench`` are thin CLIs.
``tfdist.fit`` trains any compiled Keras model with that loop.

Importing ``tfdist`` does not import TensorFlow, so that CLIs can set up
logical devices and environment variables before TensorFlow starts.
"""

__version__ = "0.1.0"


def fit(model_fn, x=None, y=None, **kwargs):
    """Keras' ``fit`` for any compiled Keras 3 model under every strategy (``tfdist.training.fit.fit``)."""
    from tfdist.training.fit import fit as _fit

    return _fit(model_fn, x, y, **kwargs)
