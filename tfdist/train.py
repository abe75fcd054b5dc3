"""``python -m tfdist.train``: a thin absl main over ``tfdist.segmentation.run``.

    python -m tfdist.train --config quick --strategy one_device --model_dir runs/q
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from absl import flags  # noqa: E402

from tfdist.config import RETIRED  # noqa: E402
from tfdist.errors import UserError, check_directory, run_main  # noqa: E402
from tfdist.segmentation.command import define_flags, given_fields  # noqa: E402
from tfdist.segmentation.config import build_config  # noqa: E402

FLAGS = flags.FLAGS


def config_from_flags():
    """The resolved config: defaults -> --config file -> flags present on the command line."""
    return build_config(FLAGS.config, given_fields(FLAGS))


def check_dump_weights(path: str) -> None:
    """Refuse a ``--dump_weights`` that cannot be a directory or cannot be written, before anything runs."""
    check_directory(path, "--dump_weights", "Expected a directory for the weights files (existing or new).")


def main(argv: list[str]) -> int:
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # TensorFlow's Python INFO lines are noise here
    if len(argv) > 1:
        raise UserError(f"Unexpected arguments. Received: {' '.join(argv[1:])}. Expected only --flags.")
    if FLAGS.dump_weights:
        check_dump_weights(FLAGS.dump_weights)
    from tfdist.runtime import hold
    from tfdist.segmentation.experiment import run

    # A benchmark that preempts this run asks it, through the environment, to hold for its signal.
    summary = run(config_from_flags(), weights_dir=FLAGS.dump_weights, hooks=hold.from_environment())
    if "eval" in summary and not summary.get("is_chief", True):
        print(f"final eval: mean_iou {summary['eval']['mean_iou']:.4f} "
              f"(this worker writes nothing; the chief's outputs are in {summary['model_dir']})", flush=True)
    elif "eval" in summary:
        ev = summary["eval"]
        print(f"final eval: mean_iou {ev['mean_iou']:.4f}  pixel_accuracy {ev['pixel_accuracy']:.4f}  "
              f"loss {ev['loss']:.4f}  ({summary['images_per_second']:.1f} images/s, "
              f"{summary['wall_seconds']:.0f} s, outputs in {summary['model_dir']})", flush=True)
    return 0


def entry() -> None:
    """Console-script entry point (``tfdist-train``)."""
    run_main(main, define_flags, retired=RETIRED)


if __name__ == "__main__":
    entry()
