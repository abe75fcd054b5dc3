"""``tfdist.train`` on a damaged run directory, or one it cannot write: one line, status 2, nothing written.

A run of 2 epochs (checkpoints at steps 2 and 4) is trained once; each case damages a copy of it (a file
emptied, garbled or made a directory, a directory made a file, the checkpoint state zeroed or naming a
checkpoint whose files are gone) and points ``tfdist.train`` at it. The line names the file and what to do
(the checkpoint whose files are all there, where there is one); the copy keeps its paths, kinds and bytes.
Every check runs before TensorFlow starts. The same holds for places no process can write (``/proc``,
``/sys``, which ``os.access`` calls writable for root) and for more steps than the step counter counts.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from helpers.clis import assert_user_error, run_cli

FLAGS = ["--strategy=one_device", "--image_size=32", "--train_examples=32", "--eval_examples=16",
         "--base_filters=4", "--depth=2", "--global_batch_size=8", "--optimizer=sgd", "--log_every=1",
         "--steps_per_epoch=2", "--checkpoint_every=2"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished run of 4 steps, checkpoints at steps 2 and 4."""
    model_dir = tmp_path_factory.mktemp("damaged") / "run"
    result = run_cli("tfdist.train", f"--model_dir={model_dir}", "--epochs=2", *FLAGS, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return model_dir


def snapshot(path: Path) -> dict | None:
    """Every path under ``path`` with its kind and bytes (None: nothing there)."""
    if not path.exists():
        return None
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else "dir" for p in sorted(path.rglob("*"))}


def write(name: str, data: bytes):
    return lambda run: (run / name).write_bytes(data)


def into_dir(name: str):
    def change(run: Path):
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        target.mkdir()
    return change


def into_file(name: str):
    def change(run: Path):
        shutil.rmtree(run / name)
        (run / name).write_text("not a directory\n")
    return change


def drop_latest(run: Path):
    for item in (run / "checkpoints").glob("ckpt-4.*"):
        item.unlink()


def cut_latest(run: Path):
    for item in (run / "checkpoints").glob("ckpt-4.data-*"):
        item.write_bytes(item.read_bytes()[:10])


def cut_params_in_half(run: Path):
    lines = (run / "params.yaml").read_text().splitlines(keepends=True)
    (run / "params.yaml").write_text("".join(lines[:len(lines) // 2]))  # still YAML, with fewer settings


def edit_params(edit):
    def change(run: Path):
        params = yaml.safe_load((run / "params.yaml").read_text())
        edit(params)
        (run / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return change


def into_link(name: str, target: str):
    def change(run: Path):
        (run / name).unlink()
        (run / name).symlink_to(target)
    return change


#: (case, how the copy is damaged, what the line must say besides the copy's path).
DAMAGED = [
    ("params_empty", write("params.yaml", b""), "its params.yaml is empty"),
    ("params_a_dir", into_dir("params.yaml"), "Invalid value for `--model_dir`: its params.yaml is not a file"),
    ("params_cut_in_half", cut_params_in_half, "its params.yaml lacks the setting "),
    ("params_unknown_key_in_a_section", edit_params(lambda p: p["train"].update(epochz=3)),
     "its params.yaml has an unknown setting train.epochz"),
    ("params_value_cut", edit_params(lambda p: p["train"].update(export="tr")),
     "its params.yaml holds a value of another type: train.export='tr'"),
    ("metrics_garbage", write("metrics.jsonl", b'{"step": 1, "loss": 2.0}\nnot json\n'),
     "line 2 of its metrics.jsonl is not a JSON object. Received: b'not json\\n'"),
    ("metrics_a_dir", into_dir("metrics.jsonl"), "its metrics.jsonl is not a file. Received: a directory"),
    ("summary_a_dir", into_dir("summary.json"), "its summary.json is not a file. Received: a directory"),
    ("checkpoint_nul", write("checkpoints/checkpoint", b"\0" * 100),
     "its checkpoints/checkpoint is not a checkpoint state; ckpt-4's files are all there: write "
     "'model_checkpoint_path: \"ckpt-4\"' into it"),
    ("checkpoint_empty", write("checkpoints/checkpoint", b""), "its checkpoints/checkpoint is empty; ckpt-4's"),
    ("checkpoint_missing", drop_latest,
     "its checkpoints/checkpoint names ckpt-4, whose files are not there; ckpt-2's files are all there"),
    ("checkpoint_missing_all", lambda run: [p.unlink() for p in (run / "checkpoints").glob("ckpt-*")],
     "its checkpoints/checkpoint names ckpt-4, whose files are not there; no checkpoint's files are all there"),
    ("checkpoints_a_file", into_file("checkpoints"), "its checkpoints is not a directory. Received: a file"),
    ("export_a_file", into_file("export"), "its export is not a directory. Received: a file"),
    ("tensorboard_a_file", into_file("tensorboard"), "its tensorboard is not a directory. Received: a file"),
    ("tensorboard_train_a_file", into_file("tensorboard/train"),
     "its tensorboard/train is not a directory. Received: a file"),
    ("exported_model_a_dir", into_dir("export/model.keras"),
     "its export/model.keras is not a file. Received: a directory"),
    ("summary_garbage", write("summary.json", b"{not json"),
     "its summary.json is not a JSON object. Received: b'{not json'"),
    ("metrics_a_link_to_nothing", into_link("metrics.jsonl", "gone.jsonl"),
     "its metrics.jsonl is not a file. Received: a symbolic link that leads nowhere"),
    ("params_a_symlink_loop", into_link("params.yaml", "params.yaml"),
     "its params.yaml is not a file. Received: '{run}', where it is a symbolic link that leads nowhere"),
    ("checkpoint_data_cut", cut_latest, "checkpoints/ckpt-4.index or its data is damaged (IndexError: Read less bytes "
     "than requested); an older checkpoint, {run}/checkpoints/ckpt-2, is whole"),
]


@pytest.mark.xdist_group("damaged_run_dir")
@pytest.mark.parametrize("case, damage, needle", DAMAGED, ids=[case for case, _, _ in DAMAGED])
def test_a_damaged_run_directory_is_one_line_and_left_as_it_is(tmp_path, finished_run, case, damage, needle):
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    damage(run)
    before = snapshot(run)
    result = run_cli("tfdist.train", f"--model_dir={run}", "--epochs=3", *FLAGS, timeout=120)
    line = assert_user_error(result, re.escape(needle.replace("{run}", str(run))))
    assert str(run) in line, line
    assert snapshot(run) == before


@pytest.mark.xdist_group("damaged_run_dir")
def test_a_model_dir_with_dot_dot_is_the_directory_the_kernel_resolves(tmp_path, finished_run):
    """``..`` is resolved as the kernel would (the damaged copy is found and named), and the directory it steps
    out of is never made."""
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    (run / "checkpoints" / "checkpoint").write_bytes(b"")
    result = run_cli("tfdist.train", f"--model_dir={tmp_path}/missing/../copy", "--epochs=3", *FLAGS, timeout=120)
    assert_user_error(result, re.escape(f"Invalid --model_dir {run}: its checkpoints/checkpoint is empty"))
    assert not (tmp_path / "missing").exists()


BAD_PLACES = [
    ("model_dir_in_proc", ["--model_dir={tmp}/../../proc/tfdist-x/run"],
     "Invalid value for `--model_dir`: /proc is not writable."),
    ("model_dir_in_sys", ["--model_dir=/sys/tfdist-x"], "Invalid value for `--model_dir`: /sys is not writable."),
    ("dump_weights_in_sys", ["--model_dir={tmp}/run", "--dump_weights=/sys/tfdist-x"],
     "Invalid value for `--dump_weights`: /sys is not writable. Received: '/sys/tfdist-x'."),
    ("steps_past_int64", ["--model_dir={tmp}/run", "--epochs=4294967296", "--steps_per_epoch=2147483648"],
     "Invalid `--epochs` with `--steps_per_epoch`: more steps than a run counts. Received: epochs=4294967296 "
     "epochs of steps_per_epoch=2147483648 steps, 9223372036854775808 steps."),
]


@pytest.mark.parametrize("case, flags, needle", BAD_PLACES, ids=[case for case, _, _ in BAD_PLACES])
def test_a_place_no_run_can_write_or_a_run_too_long_is_one_line(tmp_path, case, flags, needle):
    depth = "/".join([".."] * len(tmp_path.parts))  # from tmp_path up to /, whatever its depth
    flags = [flag.format(tmp=tmp_path).replace("/../../proc", f"/{depth}/proc") for flag in flags]
    result = run_cli("tfdist.train", *FLAGS, *flags, timeout=120)
    assert_user_error(result, re.escape(needle))
    assert list(tmp_path.iterdir()) == []


def test_a_row_being_appended_is_no_damage_but_a_garbled_last_line_is(tmp_path):
    """A task that starts while the chief appends a row may read the row's beginning without its newline."""
    from tfdist.errors import UserError
    from tfdist.rundir import RunDir

    run = RunDir(tmp_path)
    run.metrics.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    run.check_intact()
    for garbled in ('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n', '{"step": 1}\nnot json'):
        run.metrics.write_text(garbled)
        with pytest.raises(UserError, match="line 2 of its metrics.jsonl is not a JSON object"):
            run.check_intact()
