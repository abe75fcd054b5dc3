"""Bad input to ``tfdist.manifest``, ``tfdist.launch``, ``tfdist.tfconfig`` and ``tfdist.predict`` ends as one line
with status 2.

Each case runs the CLI's own entry in this process (its flags defined, parsed and removed again), so the
table costs no process start; a few run as real processes to show the one-line, status-2 contract end to
end. A case writes nothing, and the run directory it is given is left byte for byte as it was.
"""

from __future__ import annotations

import importlib
import os
import struct
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from absl import app, flags  # noqa: F401  (app defines its flags, and absl.logging its own, before any test)

from helpers.clis import REPO, assert_user_error, start_cli
from tfdist import config as config_lib
from tfdist.strategies import host

LOCAL_MWM = REPO / "configs" / "clusters" / "local_mwm.yaml"


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels (no pixel data follows): what Pillow opens first."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def end_waits(fifos: list[Path], stop: threading.Event) -> None:
    """Until ``stop``: open each FIFO at the other end as soon as a CLI waits on it, and close it again (a reader
    sees an empty file), so that a CLI that opens one fails its case instead of waiting for ever."""
    while not stop.wait(0.05):
        for fifo in fifos:
            for flags_ in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
                try:
                    os.close(os.open(fifo, flags_))
                except OSError:  # nobody waits to read (ENXIO)
                    pass


#: ``--model`` files of ``tfdist.check`` that are no setup: each name and its text.
USER_MODELS = {
    "model_syntax.py": "def setup(:\n",
    "model_raises.py": "raise RuntimeError('at import')\n",
    "model_exits.py": "import sys\nsys.exit(0)\n",
    "model_of_three.py": "def setup():\n    return (lambda: None, None, None)\n",
    "model_kwargs_a_list.py": "def setup():\n    return (lambda: None, None, None, [])\n",
    "model_setup_raises.py": "def setup():\n    raise ValueError('no data')\n",
    "model_setup_of_an_argument.py": "def setup(path):\n    return path\n",
    "model_nul.py": "x = 1\0\n",
    "model_without_kwargs.py": "def setup():\n    return (lambda: None, None, None, {})\n",
}


@pytest.fixture
def inputs(tmp_path):
    """A folder of inputs: a good image, images too large, FIFOs nobody writes, a run with a zeroed model."""
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "ok.png")
    (tmp_path / "bomb.png").write_bytes(png_header(30000, 30000))  # past Pillow's error limit
    (tmp_path / "large.png").write_bytes(png_header(10000, 10000))  # past its warning limit
    os.mkfifo(tmp_path / "fifo.png")
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "run" / "export").mkdir(parents=True)
    (tmp_path / "run" / "export" / "model.keras").write_bytes(bytes(4096))
    (tmp_path / "run" / "params.yaml").write_text("train: {epochs: 1}\n")
    (tmp_path / "pods.yaml").write_text("model: {encoder: mobilenetv2, encoder_weights: /on/the/pods.h5}\n")
    (tmp_path / "long_label.yaml").write_text(f"worker: [{'a' * 64}.example.com:2222]\n")
    (tmp_path / "loopback_twice.yaml").write_text("worker: [localhost:5000, 127.0.0.1:5000]\n")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "config_dir.yaml").mkdir()
    os.mkfifo(tmp_path / "fifo.h5")
    for name, text in USER_MODELS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "model_dir.py").mkdir()
    os.mkfifo(tmp_path / "model_fifo.py")
    (tmp_path / "model_loop.py").symlink_to("model_loop.py")
    stop = threading.Event()
    writer = threading.Thread(target=end_waits, args=([tmp_path / "fifo.png", tmp_path / "fifo.yaml",
                                                       tmp_path / "fifo.h5"], stop),
                              daemon=True)
    writer.start()
    yield tmp_path
    stop.set()
    writer.join(timeout=10)


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` and the bytes of its regular files (None for the others)."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run a CLI's entry in this process: ``(status, stdout, stderr)``; its flags are gone again afterwards."""
    monkeypatch.setenv("TFDIST_TF_LOGS", "1")  # no stderr filter process for this one

    def run(module: str, *args) -> tuple[int, str, str]:
        entry = importlib.import_module(module).entry
        monkeypatch.setattr(sys, "argv", [module, *map(str, args)])
        before, parsed = set(flags.FLAGS), flags.FLAGS.is_parsed()
        try:
            with pytest.raises(SystemExit) as exited:
                entry()
        finally:
            for name in set(flags.FLAGS) - before:
                delattr(flags.FLAGS, name)
            flags.FLAGS.unparse_flags()
            if parsed:
                flags.FLAGS.mark_as_parsed()
        out, err = capsys.readouterr()
        return exited.value.code or 0, out, err

    return run


def manifest(*args):
    return ("tfdist.manifest", "--cluster", LOCAL_MWM, "--image", "img", *args)


def check(*args):
    """``tfdist.check`` of one case in one mode: what it would run, were a bad flag let through, is short."""
    return ("tfdist.check.cli", "--cases=1", "--modes=one_device", *args)


#: (case, the CLI and its arguments ({d}: the inputs folder), a regex the one line must match).
BAD = [
    ("image_tag_not_ascii", ("tfdist.manifest", "--cluster", LOCAL_MWM, "--image", "img:t\u00e4", "--"),
     "`--image`: its tag .* is not ASCII"),
    ("image_registry_port_past_65535",
     ("tfdist.manifest", "--cluster", LOCAL_MWM, "--image", "reg.example.com:70000/img:1"), "registry port"),
    ("volume_not_dns_labels", manifest("--form", "jobset", "--volume", "unet..runs"), "`--volume`.*unet..runs"),
    ("gpus_past_int64", manifest("--gpus", str(2**63)), "`--gpus`"),
    ("config_and_a_bad_epochs", manifest("--", "--config", "quick", "--epochs", "-1"), "`--epochs`.*epochs=-1"),
    ("config_not_here_and_a_bad_epochs", manifest("--", "--config", "{d}/elsewhere.yaml", "--epochs=-1"),
     "`--epochs`.*epochs=-1"),
    ("model_dir_twice_the_last_outside_the_volume",
     manifest("--form", "jobset", "--volume", "unet-runs", "--", "--model_dir", "/runs/a", "--model_dir", "/tmp/b"),
     "`--model_dir`.*'/tmp/b'"),
    ("model_dir_under_the_mount_stepping_out",
     manifest("--form", "jobset", "--volume", "unet-runs", "--", "--model_dir=/runs/../etc"),
     r"`--model_dir` with --volume. Received: model_dir='/runs/\.\./etc'"),
    ("memory_zero", manifest("--memory", "0"), "`--memory`: zero.*Received: memory='0'"),
    ("cpu_zero_millicores", manifest("--cpu", "0m"), "`--cpu`: zero.*Received: cpu='0m'"),
    ("dump_weights_in_proc_after_dashes", manifest("--", "--dump_weights", "/proc/x"),
     "`--dump_weights` after --: it lies in /proc.*Received: dump_weights='/proc/x'"),
    ("model_dir_in_sys_after_dashes", manifest("--", "--model_dir=/sys/../sys/run"),
     "`--model_dir` after --: it lies in /sys"),
    ("dump_weights_given_empty_after_dashes", manifest("--", "--dump_weights="),
     "`--dump_weights` after --. Received: dump_weights=''"),
    ("tfconfig_loopback_named_twice", ("tfdist.tfconfig", "--cluster", "{d}/loopback_twice.yaml", "--task", "worker:0"),
     r"Duplicate address .*'localhost:5000' for `worker\[0\]` and '127.0.0.1:5000' for `worker\[1\]`"),
    ("global_batch_over_two_workers", manifest("--", "--global_batch_size", "3"), "global_batch_size=3 with 2 replicas"),
    ("global_batch_over_two_workers_of_two_gpus", manifest("--gpus", "2", "--", "--global_batch_size", "6"),
     "global_batch_size=6 with 4 replicas"),
    ("global_batch_of_the_config_over_the_workers", manifest("--", "--config", "quick", "--global_batch_size", "5"),
     "global_batch_size=5 with 2 replicas"),
    ("tfconfig_commands_global_batch_over_two_workers",
     ("tfdist.tfconfig", "--cluster", LOCAL_MWM, "--commands", "--", "--global_batch_size", "3"),
     "global_batch_size=3 with 2 replicas"),
    ("train_bool_given_a_value", manifest("--", "--nodeterministic=true"), "--nodeterministic=true does not take"),
    ("manifest_cluster_fifo", ("tfdist.manifest", "--cluster", "{d}/fifo.yaml", "--image", "img"), "FIFO"),
    # A word after a boolean flag would start every task's command (`yes true` never ends; `false true` does).
    ("launch_bool_then_a_word", ("tfdist.launch", "--show_startup_noise", "false", "--cluster", LOCAL_MWM, "--",
                                 "true"), "'false' is not a flag"),
    ("launch_command_without_dashes", ("tfdist.launch", "--cluster", LOCAL_MWM, "true"), "'true' is not a flag"),
    ("launch_nobool_given_a_value", ("tfdist.launch", "--noshow_startup_noise=1", "--cluster", LOCAL_MWM, "--", "true"),
     "does not take an argument"),
    ("launch_max_restarts_past_int64", ("tfdist.launch", f"--max_restarts={2**63}", "--cluster", LOCAL_MWM, "--",
                                        "true"), "--max_restarts"),
    ("launch_cluster_fifo", ("tfdist.launch", "--cluster", "{d}/fifo.yaml", "--", "true"), "FIFO"),
    ("predict_old_name_negated", ("tfdist.predict", "--noimage"), "Unknown command line flag 'noimage'"),
    ("predict_image_too_large", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/bomb.png",
                                 "--overlay_output={d}/o.png"), "`--input_image`.*bomb.png"),
    ("predict_image_past_the_warning_limit", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/large.png",
                                              "--overlay_output={d}/o.png"), "`--input_image`.*large.png"),
    ("predict_image_fifo", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/fifo.png",
                            "--overlay_output={d}/o.png"), "`--input_image`.*FIFO"),
    ("predict_zeroed_model", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/ok.png",
                              "--overlay_output={d}/o.png"), "model.keras is not a Keras model file"),
    ("predict_output_in_proc", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/ok.png",
                                "--overlay_output=/proc/o.png"), "`--overlay_output`.*cannot be written"),
    ("predict_output_in_sys", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/ok.png",
                               "--overlay_output=/sys/o.png"), "`--overlay_output`.*cannot be written"),
    ("manifest_output_fifo", manifest("--output", "{d}/fifo.yaml"), "`--output`: .*fifo.yaml is a FIFO"),
    ("tfconfig_output_fifo", ("tfdist.tfconfig", "--cluster", LOCAL_MWM, "--task", "worker:0", "--output",
                              "{d}/fifo.yaml"), "`--output`: .*fifo.yaml is a FIFO"),
    ("tfconfig_host_label_past_63", ("tfdist.tfconfig", "--cluster", "{d}/long_label.yaml", "--task", "worker:0"),
     r"`worker\[0\]`.* is not a host name \(labels of 1 to 63"),
    ("manifest_config_here_a_directory", manifest("--", "--config", "{d}/config_dir.yaml"),
     "`--config`. Received: '.*config_dir.yaml', which is not a file"),
    ("train_model_dir_given_empty", ("tfdist.train", "--model_dir="), "`--model_dir`. Received: model_dir=''"),
    ("train_dump_weights_given_empty", ("tfdist.train", "--model_dir={d}/new", "--dump_weights="),
     "`--dump_weights`. Received: dump_weights=''"),
    ("train_model_dir_symlink_loop", ("tfdist.train", "--model_dir={d}/loop/run"),
     "`--model_dir`: Too many levels of symbolic links"),
    ("train_model_dir_name_too_long", ("tfdist.train", "--model_dir={d}/" + "a" * 300),
     "`--model_dir`: File name too long"),
    ("train_dump_weights_dot_dot_onto_a_file", ("tfdist.train", "--model_dir={d}/new",
                                               "--dump_weights={d}/missing/../ok.png"),
     "`--dump_weights`: not a directory. Received: '[^']*/ok.png', an existing file"),
    ("train_base_filters_past_the_widest_layer", ("tfdist.train", "--model_dir={d}/new", "--base_filters=2049",
                                                  "--depth=1", "--image_size=8", "--train_examples=8",
                                                  "--eval_examples=8", "--global_batch_size=8", "--epochs=1",
                                                  "--strategy=one_device", "--noexport"),
     "`--base_filters`.*4098 filters in the widest layer. Expected at most 4096"),
    ("train_encoder_weights_fifo", ("tfdist.train", "--model_dir={d}/new", "--encoder=mobilenetv2",
                                    "--encoder_weights={d}/fifo.h5"), "`--encoder_weights`: .*fifo.h5 is a FIFO"),
    ("check_timeout_nan", check("--timeout=nan"), "--timeout must be a finite number"),
    ("check_output_in_proc", check("--output=/proc/tfdist-check.json"), "`--output`: it cannot be written"),
    ("check_markdown_fifo", check("--markdown={d}/fifo.yaml"),
     r"`--markdown`: it cannot be written \(a FIFO"),
    ("check_model_empty", check("--model="), r"`--model`. Received: ''. Expected MODULE:FUNCTION"),
    ("check_model_syntax_error", check("--model=model_syntax.py:setup"),
     r"`--model`: importing model_syntax.py raised SyntaxError"),
    ("check_model_raises_on_import", check("--model=model_raises.py:setup"),
     r"`--model`: importing model_raises.py raised RuntimeError \(at import\)"),
    ("check_model_exits_on_import", check("--model=model_exits.py:setup"),
     r"`--model`: importing model_exits.py raised SystemExit \(0\)"),
    ("check_model_a_module_raising", check("--model=model_raises:setup"),
     r"`--model`: importing model_raises raised RuntimeError"),
    ("check_model_nul_byte", check("--model=model_nul.py:setup"), r"`--model`: importing model_nul.py raised SyntaxError"),
    ("check_model_a_directory", check("--model=model_dir.py:setup"), r"`--model`: model_dir.py is a directory"),
    ("check_model_a_fifo", check("--model=model_fifo.py:setup"), r"`--model`: model_fifo.py is a FIFO"),
    ("check_model_a_symlink_loop", check("--model=model_loop.py:setup"),
     r"`--model`: model_loop.py is not readable \(Too many levels of symbolic links\)"),
    ("check_model_returns_three", check("--model=model_of_three.py:setup"),
     r"`--model`. Received: 'model_of_three.py:setup', which returns a tuple of 3"),
    ("check_model_kwargs_a_list", check("--model=model_kwargs_a_list.py:setup"),
     r"which returns fit_kwargs of list, not a dict"),
    ("check_model_setup_raises", check("--model=model_setup_raises.py:setup"),
     r"`--model`: model_setup_raises.py:setup raised ValueError \(no data\)"),
    ("check_model_setup_of_an_argument", check("--model=model_setup_of_an_argument.py:setup"),
     r"`--model`: .*raised TypeError \(setup\(\) missing 1 required positional argument"),
    ("check_model_a_module_function", check("--model=os:getcwd"), r"`--model`. Received: 'os:getcwd', which returns a str"),
    ("check_case_with_model", check("--model=model_without_kwargs.py:setup", "--case=3"),
     r"Invalid `--case` with `--model`. Received: --case=3 and --model=model_without_kwargs.py:setup"),
    ("check_case_a_superscript", check("--case=\u00b2"), r"`--case`. Received: \u00b2"),
    ("check_cases_past_the_bound", check(f"--cases={2**40}"), r"--cases=1099511627776: .* in the range \[1, 100000\]"),
    ("predict_a_stray_word", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/ok.png",
                              "--overlay_output={d}/o.png", "stray"), "Unexpected arguments. Received: 'stray'"),
    ("predict_overlay_onto_the_input", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/ok.png",
                                        "--overlay_output={d}/ok.png"),
     "`--overlay_output`: it is the file of --input_image"),
    ("predict_mask_onto_the_overlay", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/ok.png",
                                       "--overlay_output={d}/o.png", "--mask_output={d}/o.png"),
     "`--mask_output`: it is the file of --overlay_output"),
    ("predict_mask_output_fifo", ("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/ok.png",
                                  "--overlay_output={d}/o.png", "--mask_output={d}/fifo.png"), "`--mask_output`.*FIFO"),
]


@pytest.mark.parametrize("module, args, match", [(case[1][0], case[1][1:], case[2]) for case in BAD],
                         ids=[case[0] for case in BAD])
def test_bad_input_is_one_line_with_status_2_and_writes_nothing(cli, inputs, monkeypatch, module, args, match):
    monkeypatch.chdir(inputs)  # what a CLI would write where it runs is in the snapshot too
    before = snapshot(inputs)
    status, out, err = cli(module, *(str(a).format(d=inputs) for a in args))
    assert_user_error((status, out, err), match)
    assert snapshot(inputs) == before


#: What the checks above must still let through.
GOOD = [
    ("registry_with_a_port", ("tfdist.manifest", "--cluster", LOCAL_MWM, "--image", "reg.example.com:5000/team/img:1")),
    ("volume_of_dotted_labels", manifest("--form", "jobset", "--volume", "unet.runs")),
    ("global_batch_over_two_workers_of_two_gpus", manifest("--gpus", "2", "--", "--global_batch_size", "8")),
    ("config_not_here_and_a_field_it_may_complete", manifest("--", "--config", "/elsewhere.yaml", "--num_classes", "2")),
    ("model_dir_twice_the_last_in_the_volume",
     manifest("--form", "jobset", "--volume", "unet-runs", "--", "--model_dir", "/tmp/b", "--model_dir", "/runs/a")),
    ("config_here_naming_weights_on_the_pods", manifest("--", "--config", "{d}/pods.yaml")),
    ("resources_a_thousandth", manifest("--cpu", "1m", "--memory", "0.5Gi")),
    ("dump_weights_named_like_proc_elsewhere", manifest("--", "--dump_weights", "/data/proc/x")),
]


@pytest.mark.parametrize("argv", [case[1] for case in GOOD], ids=[case[0] for case in GOOD])
def test_good_manifest_input_still_passes(cli, inputs, argv):
    status, out, err = cli(argv[0], *(str(a).format(d=inputs) for a in argv[1:]))
    assert (status, err) == (0, "") and out.startswith("---")


def test_the_last_model_dir_is_the_one_in_the_manifests(cli):
    argv = manifest("--form", "jobset", "--volume", "unet-runs", "--", "--model_dir", "/tmp/b", "--model_dir",
                    "/runs/a")
    status, out, _ = cli(argv[0], *argv[1:])
    assert status == 0 and "/runs/a" in out


@pytest.mark.parametrize("visible, driver_gpus, expected", [
    ("0,,1", None, 0),  # no driver: TensorFlow sees no GPU, whatever CUDA_VISIBLE_DEVICES says
    ("0,1", None, 0),
    (None, 2, 2),
    ("0,,1", 2, 1),  # CUDA stops at the empty entry
    ("1,0", 2, 2),
    ("0,5", 2, 1),  # and at a GPU past the last
    ("-1", 2, 0),
])
def test_auto_counts_gpus_as_tensorflow_sees_them(monkeypatch, tmp_path, visible, driver_gpus, expected):
    driver = tmp_path / "gpus"
    if driver_gpus is not None:
        for i in range(driver_gpus):
            (driver / f"0000:0{i}:00.0").mkdir(parents=True)
    monkeypatch.setattr(host, "NVIDIA_DRIVER_GPUS", str(driver))
    monkeypatch.setattr(host, "GPU_DRIVER_PATHS", (str(driver),))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert host.visible_gpus() == expected


def test_auto_without_a_gpu_driver_takes_cpu_devices_whatever_cuda_visible_devices_says(monkeypatch, tmp_path):
    monkeypatch.setattr(host, "NVIDIA_DRIVER_GPUS", str(tmp_path / "absent"))
    monkeypatch.setattr(host, "GPU_DRIVER_PATHS", (str(tmp_path / "absent"),))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,,1")
    rt = config_lib.resolve_strategy(config_lib.RuntimeConfig(strategy="auto", cpu_devices=3))
    assert (rt.strategy, rt.cpu_devices) == ("mirrored", 3)


#: Cases run as real processes, side by side: (the CLI and its arguments, a regex the one line must match).
END_TO_END = [
    (("tfdist.launch", "--show_startup_noise", "false", "--cluster", LOCAL_MWM, "--", "true"), "'false' is not a flag"),
    (("tfdist.manifest", "--cluster", "{d}/fifo.yaml", "--image", "img"), "FIFO"),
    (("tfdist.predict", "--noimage"), "'noimage'"),
    (("tfdist.predict", "--model_dir={d}/run", "--input_image={d}/bomb.png", "--overlay_output={d}/o.png"),
     "`--input_image`"),
    (("tfdist.train", "--nodeterministic=true", "--model_dir={d}/run"), "--nodeterministic=true does not take"),
]


def test_bad_input_as_real_processes_is_one_line_with_status_2(inputs):
    before = snapshot(inputs)
    runs = [(start_cli(argv[0], *(str(a).format(d=inputs) for a in argv[1:])), match) for argv, match in END_TO_END]
    for proc, match in runs:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert_user_error((proc.returncode, out, err), match)
    assert snapshot(inputs) == before
