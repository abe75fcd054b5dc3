"""``python -m tfdist.train`` and ``python -m tfdist.predict`` as a user runs them: real processes."""

import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

from conftest import REPO

TINY_FLAGS = [
    "--image_size=32", "--train_examples=64", "--eval_examples=16", "--base_filters=4", "--depth=2",
    "--global_batch_size=8", "--optimizer=sgd", "--learning_rate=0.05", "--lr_decay=none", "--log_every=1",
    "--deterministic",
]


def train(*args, timeout=240):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "tfdist.train", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def weights(model_dir):
    import tfdist.models  # noqa: F401

    return keras.models.load_model(Path(model_dir) / "export" / "model.keras").get_weights()


def test_resume_in_a_new_process_equals_training_straight(tmp_path):
    straight = train("--strategy=one_device", "--steps_per_epoch=10", "--epochs=1", f"--model_dir={tmp_path / 'a'}",
                     *TINY_FLAGS)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert "final eval: mean_iou" in straight.stdout
    half = [f"--model_dir={tmp_path / 'b'}", "--strategy=one_device", "--steps_per_epoch=5", *TINY_FLAGS]
    first = train(*half, "--epochs=1", "--noexport")  # the resumed run exports
    assert first.returncode == 0, first.stderr[-2000:]
    second = train(*half, "--epochs=2")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from" in second.stdout and "at step 5" in second.stdout
    for x, y in zip(weights(tmp_path / "b"), weights(tmp_path / "a")):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)

    # predict on the finished run: a coloured overlay at the image's own size.
    image = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(image)
    out, mask = tmp_path / "y.png", tmp_path / "m.png"
    result = subprocess.run(
        [sys.executable, "-m", "tfdist.predict", f"--model_dir={tmp_path / 'a'}", f"--image={image}",
         f"--output={out}", f"--mask_output={mask}"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert Image.open(out).size == (50, 40) and Image.open(out).mode == "RGB"
    assert np.asarray(Image.open(mask)).max() < 4


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    result = train("--strategy=one_device", "--steps_per_epoch=6", "--epochs=1", "--learning_rate=1e12",
                   "--checkpoint_every=1", f"--model_dir={tmp_path / 'nan'}",
                   *[f for f in TINY_FLAGS if not f.startswith("--learning_rate")])
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Training diverged") and "Traceback" not in result.stderr
    index = (tmp_path / "nan" / "checkpoints" / "checkpoint").read_text()
    step = int(index.split('"')[1].rsplit("-", 1)[1])
    assert f"at step {step + 1}" in last or f"at step" in last
    assert not (tmp_path / "nan" / "export").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--strategy=horovod"], "strategy='horovod'"),
        (["--image_size=abc"], "image_size"),
        (["--no_such_flag=1"], "no_such_flag"),
        (["--config=nope"], "'nope'"),
        (["--image_size=60"], "image_size=60"),
        (["--dataset=folder", "--num_classes=3", "--data_dir=/nonexistent/dir"], "/nonexistent/dir"),
        (["--cluster=/nonexistent.yaml", "--task=worker:0"], "/nonexistent.yaml"),
        (["--strategy=parameter_server"], "parameter_server"),
        (["positional"], "positional"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_leaves_model_dir_alone(tmp_path, args, needle):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    before = {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
    result = train(f"--model_dir={model_dir}", *args, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert "Traceback" not in result.stderr
    assert lines[-1].startswith("error: ") and needle in lines[-1], lines
    assert before == {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
