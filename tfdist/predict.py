"""``python -m tfdist.predict``: a trained run's predicted mask for one image, as a coloured overlay.

    python -m tfdist.predict --model_dir runs/mirrored --input_image cat.png --overlay_output cat_mask.png
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from absl import flags  # noqa: E402

from tfdist.cli import run_main  # noqa: E402
from tfdist.errors import UserError  # noqa: E402
from tfdist.segmentation.predict import predict_file  # noqa: E402

FLAGS = flags.FLAGS

#: Renamed flags (old -> new): the old name still works, with a note (each flag has one meaning across the CLIs).
RENAMED = {"image": "input_image", "output": "overlay_output"}


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none."""
    flags.DEFINE_string("model_dir", None, "A tfdist run directory (with export/model.keras).", flag_values=flag_values)
    flags.DEFINE_string("input_image", None, "The input image (PNG or JPEG).", flag_values=flag_values)
    flags.DEFINE_string("overlay_output", None, "Where to write the overlay (PNG or JPEG).", flag_values=flag_values)
    flags.DEFINE_string("mask_output", None, "Optional: where to write the class-index mask PNG.",
                        flag_values=flag_values)


def main(argv: list[str]) -> int:
    for name in ("model_dir", "input_image", "overlay_output"):
        if not FLAGS[name].value:
            raise UserError(f"Missing `--{name}`. "
                            "Received: nothing. Expected --model_dir D --input_image X.png --overlay_output Y.png.")
    predict_file(FLAGS.model_dir, FLAGS.input_image, FLAGS.overlay_output, FLAGS.mask_output)
    print(f"wrote {FLAGS.overlay_output}")
    return 0


def entry() -> None:
    """Console-script entry point (``tfdist-predict``)."""
    run_main(main, define_flags, renamed=RENAMED)


if __name__ == "__main__":
    entry()
