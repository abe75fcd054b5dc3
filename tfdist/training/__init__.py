"""The one distributed training loop: steps, loops, controller, checkpoints, outputs.

``run(config)`` is the entry point; the rest is importable for notebooks.
"""


def run(config, **kwargs):
    """Train and evaluate ``config`` (see ``tfdist.training.experiment.run``)."""
    from tfdist.training.experiment import run as _run

    return _run(config, **kwargs)
