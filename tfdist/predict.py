"""``python -m tfdist.predict``: a trained run's predicted mask for one image, as a coloured overlay.

    python -m tfdist.predict --model_dir runs/mirrored --input_image cat.png --overlay_output cat_mask.png
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from absl import flags  # noqa: E402

from tfdist.cli import only_flags, run_main  # noqa: E402
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
    only_flags(argv)
    for name in ("model_dir", "input_image", "overlay_output"):
        if not FLAGS[name].value:
            raise UserError(f"Missing `--{name}`. "
                            "Received: nothing. Expected --model_dir D --input_image X.png --overlay_output Y.png.")
    _check_distinct_files("input_image", "overlay_output", "mask_output")
    predict_file(FLAGS.model_dir, FLAGS.input_image, FLAGS.overlay_output, FLAGS.mask_output)
    print(f"wrote {FLAGS.overlay_output}")
    return 0


def _check_distinct_files(*names: str) -> None:
    """Refuse two of the file flags ``names`` that name one file: an output would overwrite the input image, or
    the mask the overlay."""
    seen: dict[str, str] = {}
    for name in names:
        value = FLAGS[name].value
        if not value:
            continue
        real = os.path.realpath(value)
        if real in seen:
            raise UserError(f"Invalid value for `--{name}`: it is the file of --{seen[real]}, which it would "
                            f"overwrite. Received: {name}={value!r}, {seen[real]}={FLAGS[seen[real]].value!r}. "
                            f"Expected a file of its own.")
        seen[real] = name


def entry() -> None:
    """Console-script entry point (``tfdist-predict``)."""
    run_main(main, define_flags, renamed=RENAMED)


if __name__ == "__main__":
    entry()
