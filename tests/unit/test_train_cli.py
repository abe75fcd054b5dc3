"""``tfdist.train --helpfull`` lists every config field; ``tfdist.predict`` refuses bad flags with one line before TensorFlow starts."""

import re

import numpy as np
import pytest

from helpers.clis import assert_user_error, run_cli


def test_helpfull_lists_every_config_field():
    """docs/running.md: every config field is a flag of the same name, and ``--helpfull`` lists them."""
    from tfdist.segmentation.config import FIELD_SECTION

    result = run_cli("tfdist.train", "--helpfull", timeout=60)
    listed = dict(re.findall(r"^\s+--(?:\[no\])?(\w+): (.*)$", result.stdout, flags=re.MULTILINE))
    assert FIELD_SECTION and {name: listed.get(name) for name in FIELD_SECTION} == {
        name: f"{section}.{name}" for name, section in FIELD_SECTION.items()
    }
    assert {"config", "dump_weights"} <= set(listed)


#: (case, predict's flags after --model_dir, what the line must name): each is refused before TensorFlow starts.
PREDICT_BAD_OUTPUT = [
    ("output_is_a_directory", lambda d: [f"--image={d / 'x.png'}", f"--output={d}"], "an existing directory"),
    ("output_without_extension", lambda d: [f"--image={d / 'x.png'}", f"--output={d / 'mask'}"],
     "without an image file extension"),
    ("output_in_a_missing_directory", lambda d: [f"--image={d / 'x.png'}", f"--output={d / 'no' / 'y.png'}"],
     "in a directory that does not exist"),
    ("mask_output_not_png", lambda d: [f"--image={d / 'x.png'}", f"--output={d / 'y.png'}",
                                       f"--mask_output={d / 'm.jpg'}"], "`--mask_output`"),
    ("image_missing", lambda d: [f"--image={d / 'nope.png'}", f"--output={d / 'y.png'}"], "Cannot read image"),
]


@pytest.mark.parametrize("case, flags, needle", PREDICT_BAD_OUTPUT, ids=[c for c, _, _ in PREDICT_BAD_OUTPUT])
def test_predict_refuses_a_bad_output_or_image_with_one_line_before_tensorflow_starts(tmp_path, case, flags, needle):
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    result = run_cli("tfdist.predict", f"--model_dir={tmp_path / 'run'}", *flags(tmp_path), timeout=120)
    assert_user_error(result, re.escape(needle))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.png"]  # nothing written



#: Runs tfdist.train's entry with the flags in argv and prints, at exit, whether TensorFlow was imported.
WITHOUT_TENSORFLOW = """
import atexit, runpy, sys
atexit.register(lambda: print("tensorflow imported:", "tensorflow" in sys.modules, flush=True))
sys.argv = ["tfdist.train", *sys.argv[1:]]
runpy.run_module("tfdist.train", run_name="__main__")
"""


@pytest.mark.parametrize("flags, needle", [
    (["--strategy=parameter_server"], "Missing cluster for strategy=parameter_server"),
    (["--dataset=folder", "--num_classes=3", "--data_dir=/nonexistent/dir"], "/nonexistent/dir"),
    (["--strategy=mirrored", "--cpu_devices=2", "--global_batch_size=3"], "global_batch_size=3 with 2 replicas"),
], ids=["no_cluster", "folder_missing", "batch_over_replicas"])
def test_bad_input_checked_before_tensorflow_starts_is_refused_without_importing_it(tmp_path, python, flags, needle):
    """A user error of the flags, the cluster, the dataset or the batch costs no TensorFlow start-up."""
    result = python(["-c", WITHOUT_TENSORFLOW, f"--model_dir={tmp_path / 'run'}", *flags], timeout=120)
    assert_user_error((result.returncode, "", result.stderr), re.escape(needle))
    assert result.stdout.strip().endswith("tensorflow imported: False"), result.stdout
    assert not (tmp_path / "run").exists()
