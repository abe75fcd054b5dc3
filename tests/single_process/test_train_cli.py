"""``python -m tfdist.train`` and ``python -m tfdist.predict`` as a user runs them: real processes."""

import contextlib
import json
import re
import socket
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from PIL import Image

from helpers.clis import assert_user_error, run_cli
from tfdist.cluster.network import free_ports
from tfdist.config import RETIRED
from tfdist.errors import DIVERGED_EXIT_CODE, USAGE_EXIT_CODE
from helpers.outputs import checkpoint_values

TINY_FLAGS = [
    "--image_size=32", "--train_examples=64", "--eval_examples=16", "--base_filters=4", "--depth=2",
    "--global_batch_size=8", "--optimizer=sgd", "--learning_rate=0.05", "--lr_decay=none", "--log_every=1",
    "--deterministic",
]

#: Lines TensorFlow 2.21 prints once it is imported, whatever TF_CPP_MIN_LOG_LEVEL says:
#: absl's "All log messages before absl::InitializeLog() are written to STDERR" and glog-style lines
#: (``I0000 00:00:... file.cc:12] oneDNN custom operations are on ...``, cudart's "Could not find cuda drivers").
TF_STARTUP_LINE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)|[IWEF]\d{4} \d\d:\d\d:\d\d)")


def weights(model_dir):
    import tfdist.models.unet  # noqa: F401

    return keras.models.load_model(Path(model_dir) / "export" / "model.keras").get_weights()


def expected_mask(model, image: np.ndarray) -> np.ndarray:
    """What tfdist.predict documents, computed here: the image resized (bilinear) to the model's size,
    the argmax of the logits, and that mask upsampled by nearest neighbour to the image's own size
    (TensorFlow's rule: source pixel floor((i + 0.5) * in / out))."""
    size = model.input_shape[1]
    x = tf.image.resize(image[None].astype(np.float32) / 255.0, (size, size), method="bilinear")
    classes = np.argmax(np.asarray(model(x, training=False))[0], axis=-1)
    rows, cols = (np.minimum(((np.arange(n) + 0.5) * size / n).astype(int), size - 1) for n in image.shape[:2])
    return classes[rows][:, cols].astype(np.uint8)


def test_resume_in_a_new_process_equals_training_straight(tmp_path):
    straight = run_cli("tfdist.train", "--strategy=one_device", "--steps_per_epoch=10", "--epochs=1",
                       f"--model_dir={tmp_path / 'a'}", *TINY_FLAGS)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert "final eval: mean_iou" in straight.stdout
    half = [f"--model_dir={tmp_path / 'b'}", "--strategy=one_device", "--steps_per_epoch=5", *TINY_FLAGS]
    # The retired --ps_shards 0/1 and --ps_min_shard_bytes change nothing (the run resumes without them): a note each.
    first = run_cli("tfdist.train", *half, "--epochs=1", "--noexport", "--ps_shards=1", "--ps_min_shard_bytes=1024")
    assert first.returncode == 0, first.stderr[-2000:]
    assert [line for line in first.stderr.splitlines() if line.startswith("note: ")] == [
        f"note: --{name} is deprecated and has no effect: {why}" for name, why in RETIRED.items()]
    second = run_cli("tfdist.train", *half, "--epochs=2")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from" in second.stdout and "at step 5" in second.stdout
    for x, y in zip(weights(tmp_path / "b"), weights(tmp_path / "a")):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


def test_predict_writes_the_models_own_mask_at_the_images_size(tmp_path):
    """docs/running.md: ``tfdist.predict --model_dir D --image X --output Y`` writes the predicted mask of D's exported
    model. The mask (--mask_output) is the model's own prediction pixel for pixel, at the image's size (40x50
    from the model's 32x32), and the overlay is exactly that mask over the image.

    The model is an untrained UNet saved where a run exports it, its head made to tell classes apart on this
    image: logits scaled up (no near ties that rounding could flip) and centred per class by the head's bias
    (several classes in the mask; a model trained for a few steps predicts background everywhere). The bias
    also makes the mask depend on the input's scale, so that predict's /255 counts.
    """
    from tfdist.data import generate_shapes
    from tfdist.models import build_unet
    from tfdist.visualize import overlay

    pixels = generate_shapes(1, image_size=50, seed=3)[0][0][5:45]
    keras.utils.set_random_seed(1)
    model = build_unet(image_size=32, num_classes=4, base_filters=4, depth=2)
    head = model.get_layer("logits_conv")
    head.kernel.assign(head.kernel * 1000.0)
    logits = model(tf.image.resize(pixels[None] / 255.0, (32, 32)), training=False)
    head.bias.assign(-np.mean(np.asarray(logits), axis=(0, 1, 2)))
    (tmp_path / "run" / "export").mkdir(parents=True)
    model.save(tmp_path / "run" / "export" / "model.keras")
    image = tmp_path / "x.png"
    Image.fromarray(pixels).save(image)
    out, mask = tmp_path / "y.png", tmp_path / "m.png"
    result = run_cli("tfdist.predict", f"--model_dir={tmp_path / 'run'}", f"--image={image}", f"--output={out}",
                     f"--mask_output={mask}", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = expected_mask(keras.models.load_model(tmp_path / "run" / "export" / "model.keras"), pixels)
    assert expected.shape == (40, 50) and len(np.unique(expected)) >= 3
    np.testing.assert_array_equal(np.asarray(Image.open(mask)), expected)
    assert Image.open(out).mode == "RGB"
    np.testing.assert_array_equal(np.asarray(Image.open(out)), overlay(pixels, expected))


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, strategy):
    """docs/running.md: a NaN or Inf loss stops the run (exit 3) and keeps the last good checkpoint.

    With a checkpoint every step, the kept one is that of the step before the one the error names, its
    weights are finite, and every logged step before it had a finite loss.
    """
    model_dir = tmp_path / "nan"
    result = run_cli("tfdist.train", f"--strategy={strategy}", "--cpu_devices=2", "--steps_per_epoch=6",
                     "--epochs=1", "--learning_rate=1e12", "--checkpoint_every=1", f"--model_dir={model_dir}",
                     *[f for f in TINY_FLAGS if not f.startswith("--learning_rate")])
    assert result.returncode == DIVERGED_EXIT_CODE == 3, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: Training diverged"), result.stderr[-2000:]
    step = int(re.search(r" at step (\d+)\.", errors[0]).group(1))
    assert step >= 2  # the first step's loss comes from the initial weights: finite
    kept = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    assert kept == str(model_dir / "checkpoints" / f"ckpt-{step - 1}") and f"is kept: {kept}." in errors[0]
    saved = checkpoint_values(kept)
    assert saved["step/.ATTRIBUTES/VARIABLE_VALUE"] == step - 1
    floats = {k: v for k, v in saved.items() if np.issubdtype(np.asarray(v).dtype, np.floating)}
    assert len(floats) > 20  # the weights (and the optimizer's state) of the model
    assert all(np.isfinite(v).all() for v in floats.values()), [k for k, v in floats.items() if not np.isfinite(v).all()]
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, step)) and all(np.isfinite(r["loss"]) for r in train_rows)
    assert not (model_dir / "export").exists()


def _cluster(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _bad_folder(tmp_path: Path) -> Path:
    """A folder dataset of two pairs, where b's mask has a pixel of class 7, for --num_classes=3."""
    for sub in ("images", "masks"):
        (tmp_path / "data" / sub).mkdir(parents=True)
    for stem, largest in (("a", 2), ("b", 7)):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "data" / "images" / f"{stem}.png")
        Image.fromarray(np.full((8, 8), largest, np.uint8)).save(tmp_path / "data" / "masks" / f"{stem}.png")
    return tmp_path / "data"


def _connect_timeout(tmp_path, stack):
    """worker:1 of a 2-worker cluster on 127.0.0.1 never starts; worker:0 waits --connect_timeout=1 s."""
    ports = free_ports(2)
    path = _cluster(tmp_path, {"worker": [f"127.0.0.1:{p}" for p in ports]})
    return ([f"--cluster={path}", "--task=worker:0", "--strategy=multi_worker_mirrored", "--connect_timeout=1"],
            f"No answer within --connect_timeout=1s from worker:1 at 127.0.0.1:{ports[1]}")


def _address_in_use(tmp_path, stack):
    """The task's port is held (listening) by this test while the task starts."""
    (port,) = free_ports(1)
    holder = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    holder.bind(("127.0.0.1", port))
    holder.listen()
    path = _cluster(tmp_path, {"worker": f"127.0.0.1:{port}"})
    return [f"--cluster={path}", "--task=worker:0", "--strategy=one_device"], f"Address already in use: 127.0.0.1:{port}"


def _bad_mask(tmp_path, stack):
    data = _bad_folder(tmp_path)
    return (["--dataset=folder", "--num_classes=3", f"--data_dir={data}"],
            f"Invalid mask {data}/masks/b.png. Received a pixel value 7")


def _config_not_utf8(tmp_path, stack):
    """An experiment file with a byte that is not UTF-8 in a value."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"train:\n  epochs: \"\xff\"\n")
    return [f"--config={path}"], f"Invalid experiment file {path}: it is not UTF-8 text. Received: byte b'\\xff'"


def _model_dir_a_file(tmp_path, stack):
    path = tmp_path / "run.txt"
    path.write_text("a file")
    return [f"--model_dir={path}"], f"Invalid value for `--model_dir`: not a directory. Received: '{path}', an existing file."


def _params(text: bytes, needle: str):
    """A case whose --model_dir holds a params.yaml of ``text``, which no tfdist run wrote; ``needle`` after its path."""
    def case(tmp_path, stack):
        (tmp_path / "old").mkdir()
        (tmp_path / "old" / "params.yaml").write_bytes(text)
        return [f"--model_dir={tmp_path / 'old'}"], needle.format(tmp_path / "old" / "params.yaml")
    return case


def _dump_weights_a_file(tmp_path, stack):
    path = tmp_path / "weights"
    path.write_text("a file")
    return [f"--dump_weights={path}"], f"Invalid value for `--dump_weights`: not a directory. Received: '{path}'"


def _config(text: str, needle: str):
    """A case whose --config is a YAML file of ``text``; ``needle`` after the file's path."""
    def case(tmp_path, stack):
        path = tmp_path / "experiment.yaml"
        path.write_text(text)
        return [f"--config={path}"], needle.format(path)
    return case


def _other_client(record: str | None):
    """A case whose --model_dir tfdist.fit wrote: its ``fit.yaml`` (``record``), or checkpoints and no params.yaml."""
    def case(tmp_path, stack):
        run = tmp_path / "fitted"
        (run / "checkpoints").mkdir(parents=True)
        if record is None:
            (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
        else:
            (run / "fit.yaml").write_text(record)
        return ([f"--model_dir={run}"],
                f"Invalid --model_dir {run}: it holds a tfdist.fit run, which tfdist.train cannot resume.")
    return case


def _truncated_checkpoint(tmp_path, stack):
    """A copy of the finished run whose latest checkpoint's index is cut short (a disk that filled up)."""
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(FINISHED[0], run)
    index = sorted((run / "checkpoints").glob("ckpt-*.index"))[-1]
    index.write_bytes(index.read_bytes()[:10])
    return ([f"--model_dir={run}"], f"Invalid model_dir {run}: its latest checkpoint cannot be read, "
                                    f"{str(index)[:-len('.index')]}.index or its data is damaged")


#: A directory no process may create files in, root's included (procfs refuses them).
UNWRITABLE = "/proc/1"


#: Cases whose check runs after TensorFlow has started (and printed its start-up lines): the rendezvous
#: of the peers ends right before the strategy binds the gRPC port, once TensorFlow's devices are set up.
AFTER_TENSORFLOW_STARTS = {"connect_timeout", "truncated_checkpoint"}


#: (case, flags or a function (tmp_path, ExitStack) -> (flags, needle), what the line must name). Each runs
#: after TINY_FLAGS, on the finished run they made: every user error docs/running.md documents (a bad flag,
#: config, cluster file, dataset or task; a run directory that another run holds).
BAD_INPUT = [
    ("strategy", ["--strategy=horovod"], "strategy='horovod'"),
    ("flag_type", ["--image_size=abc"], "image_size"),
    ("unknown_flag", ["--no_such_flag=1"], "no_such_flag"),
    ("config", ["--config=nope"], "'nope'"),
    ("config_not_utf8", _config_not_utf8, None),
    ("image_size", ["--image_size=30"], "image_size=30"),
    ("progress_timeout", ["--progress_timeout=-1"], "progress_timeout=-1"),
    ("ps_shards", ["--ps_shards=2"], "ps_shards=2"),
    ("folder_missing", ["--dataset=folder", "--num_classes=3", "--data_dir=/nonexistent/dir"], "/nonexistent/dir"),
    ("folder_bad_mask", _bad_mask, None),
    ("pet_data_dir_under_a_file", ["--dataset=oxford_iiit_pet", "--data_dir=README.md/pets"],
     "Invalid value for `--data_dir`: README.md is a file. Received: 'README.md/pets'."),
    ("cluster_file", ["--cluster=/nonexistent.yaml", "--task=worker:0"], "/nonexistent.yaml"),
    ("no_cluster", ["--strategy=parameter_server"], "parameter_server"),
    ("positional", ["positional"], "positional"),
    ("connect_timeout", _connect_timeout, None),
    ("address_in_use", _address_in_use, None),
    ("batch_over_replicas", ["--strategy=mirrored", "--cpu_devices=2", "--global_batch_size=3"],
     "global_batch_size=3 with 2 replicas"),
    ("resume_other_batch", ["--global_batch_size=16"], "it holds a run with train.global_batch_size=8"),
    ("resume_other_model", ["--base_filters=8"], "it holds a run with model.base_filters=4"),
    ("model_dir_a_file", _model_dir_a_file, None),
    ("model_dir_under_a_file", ["--model_dir=README.md/run"], "Invalid value for `--model_dir`: README.md is a file."),
    ("params_not_utf8", _params(b"model: {base_filters: \xff}\n", "Cannot read {}: it is not UTF-8 text"), None),
    ("params_not_a_mapping", _params(b"- 1\n", "Invalid {}: not a mapping of sections"), None),
    ("dump_weights_a_file", _dump_weights_a_file, None),
    ("dump_weights_under_a_file", ["--dump_weights=README.md/weights"],
     "Invalid value for `--dump_weights`: README.md is a file. Received: 'README.md/weights'"),
    ("seed_out_of_range", ["--seed=-1"], "seed=-1. Expected an integer in 0..2**32-1."),
    ("shapes_fewer_classes", ["--num_classes=3"], "`--num_classes` for shapes. Received: num_classes=3."),
    # Seen in a --config; the flag here, as TINY_FLAGS' own --train_examples would win over a file's.
    ("train_examples_past_memory", ["--train_examples=1000000000000"],
     "Invalid value for `--train_examples`: its shapes split would take"),
    ("config_duplicate_key", _config("train:\n  epochs: 2\n  epochs: 3\n",
                                     "Invalid experiment file {}: the key 'epochs' is given twice, on lines 2 and 3."),
     None),
    ("model_dir_unwritable", [f"--model_dir={UNWRITABLE}/run"],
     f"Invalid value for `--model_dir`: {UNWRITABLE} is not writable. Received: '{UNWRITABLE}/run'."),
    ("dump_weights_unwritable", [f"--dump_weights={UNWRITABLE}/weights"],
     f"Invalid value for `--dump_weights`: {UNWRITABLE} is not writable. Received: '{UNWRITABLE}/weights'."),
    ("resume_other_optimizer", ["--optimizer=adam"], "it holds a run with train.optimizer='sgd'. Received: optimizer="),
    ("resume_other_precision", ["--precision=mixed_float16"],
     "it holds a run with runtime.precision='float32'. Received: precision='mixed_float16'."),
    ("resume_a_fit_run", _other_client("client: tfdist.fit\nbatch_size: 8\n"), None),
    ("resume_fit_checkpoints", _other_client(None), None),
    ("truncated_checkpoint", _truncated_checkpoint, None),
    ("cpu_devices_absurd", ["--cpu_devices=1000000"], "Received: cpu_devices=1000000. Expected an integer in 0..1024"),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run that finished (2 steps, exported): what each bad command is pointed at."""
    model_dir = tmp_path_factory.mktemp("finished") / "run"
    result = run_cli("tfdist.train", f"--model_dir={model_dir}", "--strategy=one_device", "--steps_per_epoch=2",
                     "--epochs=1", *TINY_FLAGS)
    assert result.returncode == 0, result.stderr[-2000:]
    FINISHED[:] = [model_dir]
    return model_dir


#: The finished run's directory, for the cases that copy it.
FINISHED: list = []


def _contents(directory: Path) -> dict:
    """Every file and directory under ``directory``: bytes and modification time (a rewrite with the same bytes shows)."""
    return {str(p.relative_to(directory)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*"))}


@pytest.mark.parametrize("case, args, needle", BAD_INPUT, ids=[case for case, _, _ in BAD_INPUT])
def test_bad_input_exits_2_with_one_line_and_leaves_a_finished_run_alone(tmp_path, finished_run, case, args, needle):
    """docs/running.md: a user error ends with exit status 2 and one line on stderr, and leaves --model_dir untouched.

    ``--model_dir`` is a finished run's; every file in it must be byte for byte the same afterwards, not
    rewritten, and none may be added. Where the check can only run after TensorFlow has started
    (``AFTER_TENSORFLOW_STARTS``), TensorFlow's own start-up lines may come first (they are filtered
    unless the filter is off); tfdist's line is the only other one.
    """
    before = _contents(finished_run)
    with contextlib.ExitStack() as stack:
        if callable(args):
            args, needle = args(tmp_path, stack)
        result = run_cli("tfdist.train", f"--model_dir={finished_run}", *TINY_FLAGS, *args, timeout=120)
    assert USAGE_EXIT_CODE == 2
    stderr = result.stderr
    if case in AFTER_TENSORFLOW_STARTS:
        stderr = "".join(line + "\n" for line in stderr.splitlines() if not TF_STARTUP_LINE.match(line))
    assert_user_error((result.returncode, result.stdout, stderr), re.escape(needle))
    assert before == _contents(finished_run)


def test_a_public_address_in_the_cluster_spec_is_warned_about(tmp_path):
    """docs/clusters.md (Security): tfdist.train warns when a cluster spec has an address that may be public.

    A one-task cluster on 8.8.8.8 (one_device runs on a cluster of one task; nothing connects to it).
    """
    (port,) = free_ports(1)
    path = _cluster(tmp_path, {"worker": f"8.8.8.8:{port}"})
    result = run_cli("tfdist.train", f"--cluster={path}", "--task=worker:0", "--strategy=one_device",
                     "--steps_per_epoch=1", "--epochs=1", "--noexport", f"--model_dir={tmp_path / 'run'}", *TINY_FLAGS)
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if "may be reachable from outside" in line]
    assert len(warnings) == 1 and f"{path} has addresses that may be reachable from outside: 8.8.8.8:{port}." in \
        warnings[0], result.stderr


