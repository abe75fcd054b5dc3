"""The UNet segmentation experiment: its steps, metrics, inputs, optimizer, evaluator, and ``run(config)``.

``run(config)`` is the entry point; the rest is importable for notebooks.
"""


def run(config, **kwargs):
    """Train and evaluate ``config`` (see ``tfdist.segmentation.experiment.run``)."""
    from tfdist.segmentation.experiment import run as _run

    return _run(config, **kwargs)
