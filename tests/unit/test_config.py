"""The config tree: one precedence, unknown keys rejected by name, YAML round trip."""

import json
import re
from pathlib import Path

import pytest

from helpers.clis import assert_user_error, run_cli
from tfdist import config as config_lib
from tfdist.segmentation import config as experiment_config
from tfdist import strategies
from tfdist.strategies import host as strategy_host
from tfdist.errors import UserError


def test_defaults_validate_and_fill_derived_fields(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: auto is one_device
    config = experiment_config.build_config()
    assert config.runtime.strategy == "one_device"
    assert config.data.num_classes == 4  # shapes' own classes
    assert config.train.model_dir == "runs/one_device"


def test_steps_per_loop_zero_picks_one_for_sync_and_a_chunk_for_parameter_server():
    assert experiment_config.build_config(overrides={"strategy": "mirrored"}).train.steps_per_loop == 1
    ps = experiment_config.build_config(overrides={"strategy": "parameter_server"})
    assert ps.train.steps_per_loop == strategies.PS_STEPS_PER_LOOP > 1
    assert experiment_config.build_config(overrides={"strategy": "parameter_server", "steps_per_loop": 3}).train.steps_per_loop == 3


def test_precedence_defaults_then_file_then_flags(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data:\n  image_size: 32\n  train_examples: 64\ntrain:\n  epochs: 2\n")
    config = experiment_config.build_config(str(path), {"epochs": 5})
    assert config.data.image_size == 32  # from the file
    assert config.data.train_examples == 64
    assert config.train.epochs == 5  # the flag wins over the file
    assert config.model.base_filters == experiment_config.ModelConfig().base_filters  # default


def test_yaml_round_trip(tmp_path):
    config = experiment_config.build_config(overrides={"strategy": "one_device", "learning_rate": 0.01})
    path = tmp_path / "params.yaml"
    path.write_text(config_lib.to_yaml(config))
    assert experiment_config.build_config(str(path)) == config


def test_experiments_in_repo_load():
    names = sorted(p.stem for p in config_lib.EXPERIMENTS_DIR.glob("*.yaml"))
    assert names, "configs/experiments/ must hold at least one experiment"
    for name in names:
        experiment_config.build_config(name)


@pytest.mark.parametrize(
    "text, match",
    [
        ("data:\n  imagesize: 32\n", r"Unknown key `data.imagesize`"),
        ("dataa:\n  image_size: 32\n", r"Unknown section .* 'dataa'"),
        ("train:\n  image_size: 32\n", r"Unknown key `train.image_size`"),
        ("- 1\n- 2\n", r"top level of type list"),
        ("data: 3\n", r"Invalid section `data`"),
        ("data:\n  image_size: big\n", r"data.image_size.*Expected an int"),
        ("data: [\n", r"Cannot read experiment file"),
        ("train:\n  epochs: 2\n  seed: 1\n  epochs: 3\n", r"the key 'epochs' is given twice, on lines 2 and 4"),
        ("train:\n  epochs: 2\ndata:\n  image_size: 32\ntrain:\n  seed: 1\n",
         r"the key 'train' is given twice, on lines 1 and 5"),
    ],
)
def test_bad_experiment_files(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        experiment_config.build_config(str(path))


def test_unknown_experiment_name_lists_known_ones():
    with pytest.raises(UserError, match=r"--config.*'nope'.*Expected a YAML path or one of"):
        experiment_config.build_config("nope")


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"strategy": "horovod"}, r"strategy='horovod'.*one_device, mirrored"),
        ({"precision": "fp8"}, r"precision='fp8'"),
        ({"image_size": 60, "depth": 4}, r"image_size=60 with depth=4.*multiple of 2\*\*depth=16"),
        ({"num_classes": 1}, r"num_classes=1"),
        ({"global_batch_size": 0}, r"global_batch_size=0"),
        ({"learning_rate": -1.0}, r"learning_rate=-1.0"),
        ({"dataset": "folder"}, r"data_dir=''"),
        ({"dataset": "oxford_iiit_pet", "num_classes": 4}, r"Expected 3"),
        ({"cluster": "c.yaml"}, r"Missing `--task`"),
        ({"task": "worker:0"}, r"Missing `--cluster`"),
        ({"dropout": 1.5}, r"dropout=1.5"),
        ({"bogus": 1}, r"Unknown setting.*'bogus'"),
        ({"ps_shards": 2}, r"`--ps_shards`: variable partitioning does not work with Keras 3.*Received: ps_shards=2\."),
        ({"ps_shards": -1}, r"ps_shards=-1\. Expected a number >= 0"),
        ({"norm": "bogus"}, r"`--norm`\. Received: norm='bogus'\. Expected one of: batch, group, replica_batch, none\.$"),
        ({"batch_norm": False, "norm": "group"}, r"norm='group' and batch_norm=False\. Expected norm='none'"),
        ({"batch_norm": False, "norm": "replica_batch"}, r"norm='replica_batch' and batch_norm=False"),
        ({"seed": -1}, r"`--seed`\. Received: seed=-1\. Expected an integer in 0\.\.2\*\*32-1\.$"),
        ({"seed": 2**32}, r"`--seed`\. Received: seed=4294967296\."),
        ({"epochs": 2**63}, r"`--epochs`\. Received: epochs=9223372036854775808\. Expected an integer below 2\*\*63\.$"),
        ({"steps_per_epoch": 10**23}, r"`--steps_per_epoch`\. Received: steps_per_epoch=10+\. Expected an integer below"),
        ({"collective_timeout": float("inf")}, r"`--collective_timeout`\. Received: collective_timeout=inf\. Expected a finite"),
        ({"connect_timeout": float("inf")}, r"`--connect_timeout`\. Received: connect_timeout=inf\. Expected a finite"),
        ({"progress_timeout": float("inf")}, r"`--progress_timeout`\. Received: progress_timeout=inf\. Expected a finite"),
        ({"image_size": 8192}, r"`--image_size`\. Received: num_classes=4, image_size=8192\. Expected .*image_size <= 4096"),
        ({"num_classes": 300}, r"`--num_classes`\. Received: num_classes=300, .*Expected num_classes <= 256"),
        ({"num_classes": 3}, r"`--num_classes` for shapes\. Received: num_classes=3\. Expected at least 4"),
        ({"encoder_weights": "w.h5"}, r"Unexpected `--encoder_weights` with encoder='unet'"),
        ({"encoder": "mobilenetv2", "encoder_weights": "/nonexistent/w.h5"},
         r"`--encoder_weights`: No such file or directory\. Received: encoder_weights='/nonexistent/w.h5'"),
        ({"encoder": "mobilenetv2", "encoder_weights": __file__},
         r"`--encoder_weights`: not an HDF5 or \.keras file\. Received"),
        ({"encoder": "mobilenetv2", "encoder_weights": str(Path(__file__).parent)}, r"`--encoder_weights`: Is a directory"),
        ({"cpu_devices": 10**6}, r"`--cpu_devices`\. Received: cpu_devices=1000000\. Expected an integer in 0\.\.1024"),
    ],
)
def test_bad_values(overrides, match):
    with pytest.raises(UserError, match=match):
        experiment_config.build_config(overrides=overrides)


def test_encoder_weights_in_a_weights_file_and_the_largest_sizes_are_accepted(tmp_path):
    weights = tmp_path / "mobilenet.weights.h5"
    weights.write_bytes(experiment_config.WEIGHTS_SIGNATURES[".h5"] + b"rest")
    config = experiment_config.build_config(overrides={"encoder": "mobilenetv2", "encoder_weights": str(weights),
                                                "image_size": 4096, "num_classes": 256, "seed": 2**32 - 1})
    assert config.model.encoder_weights == str(weights) and config.data.num_classes == 256


def test_deterministic_turns_augmentation_off():
    assert experiment_config.build_config(overrides={"deterministic": True}).data.augment is False


def test_the_retired_ps_settings_are_accepted_and_change_nothing(tmp_path):
    """``ps_shards`` 0 or 1 and ``ps_min_shard_bytes`` (whole variables, as always) are still taken as overrides and
    in an experiment file (an older run's params.yaml holds both), and leave the config as it is without them."""
    plain = experiment_config.build_config(overrides={"strategy": "parameter_server"})
    assert not {"ps_shards", "ps_min_shard_bytes"} & set(experiment_config.FIELD_SECTION)
    for ps_shards in (0, 1):
        assert experiment_config.build_config(overrides={"strategy": "parameter_server", "ps_shards": ps_shards,
                                                         "ps_min_shard_bytes": 1024}) == plain
    older = tmp_path / "params.yaml"
    older.write_text("runtime:\n  strategy: parameter_server\n  ps_shards: 1\n  ps_min_shard_bytes: 262144\n")
    assert experiment_config.build_config(str(older)) == plain


@pytest.mark.parametrize("text, match", [
    ("ps_shards: 2", r"^Invalid value for `--ps_shards`: variable partitioning does not work with Keras 3 .*"
                     r"Received: ps_shards=2\. Expected 0 or 1"),
    ("ps_shards: x", r"^Invalid value for `runtime\.ps_shards` in .*params\.yaml\. Received: ps_shards='x'\. "
                     r"Expected an int\.$"),
    ("ps_min_shard_bytes: 0", r"^Invalid value for `--ps_min_shard_bytes`\. Received: ps_min_shard_bytes=0\. "
                              r"Expected a number >= 1\.$"),
    ("ps_min_shard_bytes: 9223372036854775808", r"ps_min_shard_bytes=9223372036854775808\. Expected an integer "
                                                r"below 2\*\*63\.$"),
])
def test_a_retired_ps_setting_in_a_file_is_refused_where_it_never_worked(tmp_path, text, match):
    older = tmp_path / "params.yaml"
    older.write_text(f"runtime:\n  {text}\n")
    with pytest.raises(UserError, match=match):
        experiment_config.build_config(str(older))


def test_a_retired_setting_belongs_to_the_runtime_section_of_a_file(tmp_path):
    misplaced = tmp_path / "exp.yaml"
    misplaced.write_text("train:\n  ps_shards: 1\n")
    with pytest.raises(UserError, match=r"Unknown key `train\.ps_shards`"):
        experiment_config.build_config(str(misplaced))


@pytest.mark.parametrize(
    "overrides, norm",
    [({}, "batch"), ({"batch_norm": False}, "none"), ({"norm": "none"}, "none"), ({"norm": "group"}, "group"),
     ({"batch_norm": False, "norm": "none"}, "none"), ({"norm": "replica_batch"}, "replica_batch")],
)
def test_norm_and_nobatch_norm_resolve_to_one_consistent_pair(tmp_path, overrides, norm):
    """--nobatch_norm is --norm none; the resolved config says the same in both fields and reads back the same."""
    config = experiment_config.build_config(overrides=overrides)
    assert (config.model.norm, config.model.batch_norm) == (norm, norm != "none")
    path = tmp_path / "params.yaml"
    path.write_text(config_lib.to_yaml(config))
    assert experiment_config.build_config(str(path)) == config


@pytest.mark.parametrize("flags, needle", [(["--norm=bogus"], "norm='bogus'"),
                                           (["--nobatch_norm", "--norm=group"], "norm='group' and batch_norm=False")])
def test_the_cli_refuses_a_bad_norm_with_one_line(tmp_path, flags, needle):
    """Exit status 2, one line on stderr, nothing written: the check runs before TensorFlow starts.
    (A tiny run's flags, so that a missing check fails fast rather than training.)"""
    tiny = ["--strategy=one_device", "--image_size=32", "--base_filters=4", "--depth=2", "--epochs=1",
            "--steps_per_epoch=1", "--noexport"]
    result = run_cli("tfdist.train", f"--model_dir={tmp_path / 'run'}", *tiny, *flags, timeout=120)
    assert_user_error(result, re.escape(needle))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["train_examples", "eval_examples"])
def test_a_shapes_split_past_the_hosts_memory_is_refused_before_anything_runs(name):
    """``train_examples: 1000000000000`` in a --config: one line from ``validate_data`` (no TensorFlow), not an
    allocation of terabytes after ``params.yaml`` was written."""
    from tfdist import data as data_lib

    config = experiment_config.build_config(overrides={name: 10**12})
    with pytest.raises(UserError, match=rf"`--{name}`: its shapes split would take .* GiB, more than this host's "
                                        rf".*Received: {name}=1000000000000, image_size=32\. Expected at most \d+"):
        data_lib.validate_data(config.data)
    data_lib.validate_data(experiment_config.build_config().data)  # the default sizes pass


def test_an_oxford_pet_data_dir_that_is_a_file_is_refused_before_tfds_starts(tmp_path):
    """``--data_dir`` of oxford_iiit_pet names TFDS's directory, which may not exist yet but cannot be a file: one
    line from ``validate_data`` (no TensorFlow), naming the flag and the dataset."""
    from tfdist import data as data_lib

    a_file = tmp_path / "pets"
    a_file.write_text("not a directory")
    config = experiment_config.build_config(overrides={"dataset": "oxford_iiit_pet", "data_dir": str(a_file)})
    with pytest.raises(UserError, match=r"Invalid value for `--data_dir`.*Expected the TFDS data directory of "
                                        r"oxford_iiit_pet \(existing or new\)"):
        data_lib.validate_data(config.data)
    data_lib.validate_data(experiment_config.build_config(  # a directory that does not exist yet is TFDS's to make
        overrides={"dataset": "oxford_iiit_pet", "data_dir": str(tmp_path / "new")}).data)


def test_a_resumed_run_keeps_every_field_of_the_model_section():
    """``rundir.RESUME_KEYS`` names the model section's fields itself (rundir is below the experiment's config)."""
    import dataclasses

    from tfdist.rundir import RESUME_KEYS

    assert RESUME_KEYS["model"] == tuple(f.name for f in dataclasses.fields(experiment_config.ModelConfig))
    for section, keys in RESUME_KEYS.items():
        assert set(keys) <= {f.name for f in dataclasses.fields(experiment_config.SECTIONS[section])}


def test_the_runtime_section_checks_alone_what_tfdist_setup_and_fit_take():
    runtime = config_lib.runtime_config("tfdist.setup", strategy="mirrored", cpu_devices=2)
    assert config_lib.validate_runtime(runtime) == runtime
    with pytest.raises(UserError, match=r"^Invalid value for `runtime.cpu_devices` in tfdist.fit\. Received: "
                                        r"cpu_devices='2'\. Expected an int\.$"):
        config_lib.runtime_config("tfdist.fit", cpu_devices="2")
    with pytest.raises(UserError, match=r"^Missing `--cluster` for --task=worker:0\."):
        config_lib.validate_runtime(config_lib.runtime_config("tfdist.setup", task="worker:0"))


LOCAL_MWM = {"cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"]}, "task": {"type": "worker", "index": 1}}
LOCAL_PS = {"cluster": {"chief": ["127.0.0.1:2001"], "worker": ["127.0.0.1:2002"], "ps": ["127.0.0.1:2003"]},
            "task": {"type": "ps", "index": 0}}


@pytest.mark.parametrize("environ, values, expected", [
    ({}, {}, "one_device"),
    ({}, {"cpu_devices": 1}, "one_device"),
    ({}, {"cpu_devices": 2}, "mirrored"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, {}, "mirrored"),
    ({"CUDA_VISIBLE_DEVICES": "3"}, {"cpu_devices": 4}, "one_device"),  # a GPU: its replicas are the GPUs
    ({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, {}, "one_device"),  # CUDA stops at the first invalid entry
    ({"CUDA_VISIBLE_DEVICES": ""}, {}, "one_device"),
    ({"TF_CONFIG": json.dumps(LOCAL_MWM)}, {}, "multi_worker_mirrored"),
    ({"TF_CONFIG": json.dumps(LOCAL_PS)}, {}, "parameter_server"),
    ({"TF_CONFIG": json.dumps(LOCAL_PS)}, {"strategy": "one_device"}, "one_device"),  # a name is kept
    ({}, {"cluster": "slurm", "slurm_tasks": "chief=1,worker=2,ps=1"}, "parameter_server"),  # from the flags
    ({}, {"cluster": "slurm"}, "multi_worker_mirrored"),  # a step of workers
    ({}, {"cluster": "kubernetes"}, "multi_worker_mirrored"),  # outside a pod (a launcher checking a command)
])
def test_auto_is_the_clusters_strategy_else_mirrored_over_several_devices_else_one_device(
        monkeypatch, tmp_path, environ, values, expected):
    for name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "TFDIST_TASKS"):
        monkeypatch.delenv(name, raising=False)
    driver = tmp_path / "gpus"  # the NVIDIA driver's listing: 4 GPUs where CUDA_VISIBLE_DEVICES is set, else none
    for i in range(4 if "CUDA_VISIBLE_DEVICES" in environ else 0):
        (driver / f"0000:0{i}:00.0").mkdir(parents=True)
    monkeypatch.setattr(strategy_host, "NVIDIA_DRIVER_GPUS", str(driver))
    monkeypatch.setattr(strategy_host, "GPU_DRIVER_PATHS", (str(driver),))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    runtime = config_lib.runtime_config("tfdist.setup", **values)
    assert config_lib.validate_runtime(runtime).strategy == expected
    resolved = experiment_config.validate(config_lib.override(experiment_config.Config(), values))
    assert (resolved.runtime.strategy, resolved.train.model_dir) == (expected, f"runs/{expected}")


def test_auto_reads_a_cluster_file(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    spec = tmp_path / "ps.yaml"
    spec.write_text("chief: [127.0.0.1:2001]\nworker: [127.0.0.1:2002]\nps: [127.0.0.1:2003]\n")
    runtime = config_lib.runtime_config("tfdist.fit", cluster=str(spec), task="worker:0")
    assert config_lib.validate_runtime(runtime).strategy == "parameter_server"


def test_train_fit_and_setup_default_to_auto():
    import inspect

    import tfdist

    assert config_lib.RuntimeConfig().strategy == experiment_config.Config().runtime.strategy == "auto"
    assert inspect.signature(tfdist.setup).parameters["strategy"].default == "auto"
    assert inspect.signature(tfdist.fit).parameters["strategy"].default is None  # the session's, else auto


#: Runtime arguments that each front door takes, each bad: (arguments, what the one line says).
BAD_RUNTIME = [
    ({"strategy": "horovod"}, r"^Invalid value for `--strategy`\. Received: strategy='horovod'\."),
    ({"cpu_devices": -1}, r"^Invalid value for `--cpu_devices`\. Received: cpu_devices=-1\. Expected a number >= 0\.$"),
    ({"cpu_devices": 10**6}, r"^Invalid value for `--cpu_devices`\. Received: cpu_devices=1000000\. Expected an "),
    ({"connect_timeout": 0.5}, r"^Invalid value for `--connect_timeout`\. Received: connect_timeout=0\.5\. Expected a "
                               r"number >= 1\.$"),
    ({"connect_timeout": float("inf")}, r"^Invalid value for `--connect_timeout`\. .*Expected a finite number\.$"),
    ({"task": "worker:0"}, r"^Missing `--cluster` for --task=worker:0\."),
    ({"cluster": "c.yaml"}, r"^Missing `--task` for --cluster=c\.yaml\. Received: task=''\."),
    ({"cluster": "slurm", "task": "worker:0"}, r"^Unexpected `--task` with --cluster=slurm\."),
]


@pytest.mark.parametrize("arguments, match", BAD_RUNTIME, ids=[str(a) for a, _ in BAD_RUNTIME])
def test_every_front_door_refuses_a_bad_runtime_with_the_same_line(monkeypatch, arguments, match):
    """``tfdist.train``'s config, ``tfdist.fit`` and ``tfdist.setup`` run the one list of runtime checks
    (``config.check_runtime``): the same argument is the same line from each, before TensorFlow starts."""
    import tfdist
    from tfdist.fitting.args import check_run_args

    monkeypatch.delenv("TF_CONFIG", raising=False)
    fit_arguments = {"strategy": "auto", "cpu_devices": 0, "cluster": None, "task": None, "connect_timeout": 120.0,
                     "progress_timeout": 1800.0, "seed": None, "model_dir": None, "shuffle": True,
                     "verbose": "auto", "callbacks": None}
    doors = {"tfdist.train": lambda: experiment_config.build_config(overrides=arguments),
             "tfdist.fit": lambda: check_run_args(**{**fit_arguments, **arguments}),
             "tfdist.setup": lambda: tfdist.setup(**arguments)}
    lines = {}
    for door, call in doors.items():
        with pytest.raises(UserError, match=match) as info:
            call()
        lines[door] = str(info.value)
    assert len(set(lines.values())) == 1, lines
