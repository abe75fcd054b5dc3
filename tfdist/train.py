"""``python -m tfdist.train``: ``tfdist.train``'s command (its flags and main: ``segmentation.command``) over
``tfdist.segmentation.run``.

    python -m tfdist.train --config quick --strategy one_device --model_dir runs/q
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from tfdist.segmentation import command  # noqa: E402


def entry() -> None:
    """Console-script entry point (``tfdist-train``)."""
    command.entry()


if __name__ == "__main__":
    entry()
