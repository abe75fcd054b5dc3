"""tfdist: train a UNet segmentation model with any tf.distribute strategy on Keras 3.

The package is split by idea (docs/architecture.md): ``cluster`` turns a cluster
spec into TF_CONFIG, ``strategies`` builds a strategy by name, ``models`` and
``data`` give the model and inputs, ``training`` owns the one distributed loop,
and ``train``/``tfconfig``/``launch``/``bench`` are thin CLIs. ``tfdist.fit``
trains any compiled Keras model with that loop; ``tfdist.setup`` sets up a
user's own script. Importing ``tfdist`` does not import TensorFlow, so that CLIs
can set up logical devices and environment variables before TensorFlow starts.
"""

__version__ = "0.1.0"


def fit(model_fn, x=None, y=None, **kwargs):
    """Keras' ``fit`` for any compiled Keras 3 model under every strategy (``tfdist.fitting.api.fit``)."""
    from tfdist.errors import check_keras_backend

    check_keras_backend()
    from tfdist.fitting.api import fit as _fit

    return _fit(model_fn, x, y, **kwargs)


def setup(strategy: str = "one_device", **kwargs):
    """Set this process up for ``strategy`` and return the ``tf.distribute.Strategy``; call it first.

    The first line of a script, before any TensorFlow op: logical CPUs, the
    cluster and task (TF_CONFIG, ``tfdist.launch``, Slurm, or ``cluster=``/
    ``task=``), the collectives, then the strategy; and Keras' own ``fit``
    made to work across workers (``patch_keras``). See
    ``tfdist.runtime.session.setup`` for the arguments.

        import tfdist
        strategy = tfdist.setup("multi_worker_mirrored")   # instead of tf.distribute.MultiWorkerMirroredStrategy()
    """
    from tfdist.errors import check_keras_backend

    check_keras_backend()
    from tfdist.fitting.patch import install
    from tfdist.runtime.session import setup as _setup

    result = _setup(strategy, **kwargs)
    install()
    return result


def patch_keras() -> None:
    """Make Keras' own ``fit``/``evaluate``/``predict`` work across workers (keras#20585); see ``tfdist.fitting.patch``.

    For a script that creates its own ``tf.distribute.MultiWorkerMirroredStrategy()``:
    ``import tfdist; tfdist.patch_keras()`` at its top.
    """
    from tfdist.errors import check_keras_backend

    check_keras_backend()
    from tfdist.fitting.patch import install

    install()
