"""tfdist.cluster: specs, TF_CONFIG (checked against TensorFlow's own resolver), strategies, addresses."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from tfdist import cluster
from tfdist.deploy.commands import task_commands
from tfdist.cluster import ClusterSpec, Task
from tfdist.strategies import check_strategy
from tfdist.errors import UserError
from helpers.clis import REPO, run_python

CLUSTERS = REPO / "configs" / "clusters"

FULL = {
    "evaluator": "10.0.0.5:2222",  # deliberately out of order: the spec orders types
    "ps": ["10.0.0.4:2222", "10.0.0.6:2222"],
    "worker": ["10.0.0.2:2222", "10.0.0.3:2222", "worker-2.tfdist.svc.cluster.local:2222"],
    "chief": ["10.0.0.1:2222"],
}

SPECS = {
    "full": FULL,
    "workers_only": {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]},
    "single_worker_string": {"worker": "localhost:2222"},
    "ipv6": {"chief": "[::1]:2222", "worker": ["[::1]:2223", "[fe80::1%eth0]:2224"], "ps": ["127.0.0.1:2225"]},
    "worker_evaluator": {"worker": ["h1:1", "h2:1"], "evaluator": ["h3:65535"]},
}


def spec_of(name: str) -> ClusterSpec:
    return cluster.parse_cluster_spec(SPECS[name], source=f"{name}.yaml")


# --------------------------------------------------------------------------- TensorFlow agrees


# --------------------------------------------------------------------------- ClusterSpec


def test_spec_shape_and_order():
    spec = spec_of("full")
    assert list(spec.tasks) == ["chief", "worker", "ps", "evaluator"] == list(spec.task_types)
    assert spec.as_dict() == {
        "chief": ["10.0.0.1:2222"],
        "worker": ["10.0.0.2:2222", "10.0.0.3:2222", "worker-2.tfdist.svc.cluster.local:2222"],
        "ps": ["10.0.0.4:2222", "10.0.0.6:2222"],
        "evaluator": ["10.0.0.5:2222"],
    }
    assert spec.task_list() == [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("ps", 0), ("ps", 1), ("evaluator", 0)]
    assert spec.num_tasks == 7
    assert spec.addresses()[0] == "10.0.0.1:2222" and spec.addresses()[-1] == "10.0.0.5:2222"
    assert spec.address("ps", 1) == "10.0.0.6:2222"
    assert spec.count("worker") == 3 and spec.count("evaluator") == 1
    assert spec.source == "full.yaml"
    assert spec.leader() == ("chief", 0) and spec.is_leader("chief", 0) and not spec.is_leader("worker", 0)


def test_spec_without_chief_leader_is_worker_0():
    spec = spec_of("workers_only")
    assert spec.leader() == ("worker", 0)
    assert spec.is_leader("worker", 0) and not spec.is_leader("worker", 1)
    assert spec.count("chief") == 0


def test_a_task_knows_its_place_and_its_training_cluster():
    spec = spec_of("full")
    worker = Task(spec=spec, type="worker", index=1)
    assert (worker.name, worker.address, worker.is_leader) == ("worker:1", "10.0.0.3:2222", False)
    assert Task(spec=spec, type="chief", index=0).is_leader
    assert Task(spec=spec_of("workers_only"), type="worker", index=0).is_leader
    assert "evaluator" not in worker.training_spec.tasks and worker.training_spec.num_tasks == 6
    assert worker.training_spec.source == spec.source and worker.spec is spec  # the whole cluster is kept
    assert worker.leader == Task(spec=worker.training_spec, type="chief", index=0)
    assert [p.name for p in worker.peers()] == ["chief:0", "worker:0", "worker:2", "ps:0", "ps:1"]
    assert "evaluator" in worker.tf_config()["cluster"]
    assert worker.tf_config(training=True) == {"cluster": worker.training_spec.as_dict(),
                                               "task": {"type": "worker", "index": 1}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        worker.index = 0
    with pytest.raises(TypeError):
        Task(spec, "worker", 1)  # keyword-only, as every value of the house


def test_a_task_has_one_display_name_and_one_file_name():
    worker = Task(spec=spec_of("full"), type="worker", index=1)
    assert (str(worker), worker.name, worker.slug) == ("worker:1", "worker:1", "worker-1")
    assert f"{worker}" == "worker:1"
    assert [cluster.task.slug_of(n) for n in ("worker:1", "chief:0", "local")] == ["worker-1", "chief-0", "local"]


def test_the_local_task_is_one_process_alone():
    local = Task.local()
    assert (str(local), local.name, local.slug) == ("local", "local", "local")
    assert local.is_local and local.is_leader and local.leader == local
    assert local.peers() == [] and local.training_tasks() == [local] and local.spec.num_tasks == 1
    assert Task.local() == local and hash(Task.local()) == hash(local)
    assert not Task(spec=spec_of("single_worker_string"), type="worker", index=0).is_local  # one task, not alone


def test_a_placement_alone_holds_the_local_task():
    from tfdist import strategies
    from tfdist.runtime.placement import Placement

    for name in strategies.NAMES:
        alone = Placement(strategy=name, traits=strategies.traits(name))
        assert alone.task == Task.local()
        assert (alone.name, alone.is_chief, alone.role, alone.num_workers, alone.num_tasks) == ("local", True, "train",
                                                                                                 1, 1)
        assert alone.peers() == [] and alone.training_tasks() == ["local"]
    worker = Placement(strategy="multi_worker_mirrored", traits=strategies.traits("multi_worker_mirrored"),
                       task=Task(spec=spec_of("workers_only"), type="worker", index=1))
    assert (worker.name, worker.is_chief, worker.num_workers) == ("worker:1", False, 2)
    assert worker.training_tasks() == ["worker:0", "worker:1"]


def test_spec_is_immutable_hashable_and_compares_by_value():
    spec = spec_of("full")
    with pytest.raises(TypeError):
        spec.tasks["worker"] = ("x:1",)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.source = "other"  # type: ignore[misc]
    spec.as_dict()["worker"].append("x:1")  # a copy
    assert spec.count("worker") == 3
    assert spec == spec_of("full") and hash(spec) == hash(spec_of("full"))
    assert {spec, spec_of("full")} == {spec}


def test_constructor_normalises_and_refuses_unknown_types():
    spec = ClusterSpec(tasks={"worker": ["a:1"], "chief": ["c:1"]}, source="s")
    assert list(spec.tasks) == ["chief", "worker"] and spec.tasks["worker"] == ("a:1",)
    with pytest.raises(UserError, match=r"Unknown task type in cluster spec s\. Received: 'master'"):
        ClusterSpec(tasks={"master": ("a:1",)}, source="s")


def test_single_string_is_one_task():
    assert spec_of("single_worker_string").as_dict() == {"worker": ["localhost:2222"]}


def test_yaml_and_json_files_give_the_same_spec(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(FULL))
    (tmp_path / "c.yml").write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in FULL.items()))
    from_json = cluster.load_cluster_spec(tmp_path / "c.json")
    from_yaml = cluster.load_cluster_spec(str(tmp_path / "c.yml"))
    assert from_json.tasks == from_yaml.tasks == spec_of("full").tasks
    assert from_json.source == str(tmp_path / "c.json")


def test_extension_decides_format_never_content(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("worker: [127.0.0.1:2222]\n")  # YAML in a .json file
    with pytest.raises(UserError, match=r"Invalid JSON in cluster spec file .*c\.json"):
        cluster.load_cluster_spec(path)


def test_design_md_example_parses():
    spec = cluster.load_cluster_spec(CLUSTERS / "example.yaml")
    assert spec.as_dict() == {
        "chief": ["10.0.0.1:2222"],
        "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
        "ps": ["10.0.0.4:2222"],
        "evaluator": ["10.0.0.5:2222"],
    }


@pytest.mark.parametrize(
    "address, host, port",
    [
        ("127.0.0.1:2222", "127.0.0.1", 2222),
        ("localhost:1", "localhost", 1),
        ("[::1]:2222", "::1", 2222),
        ("[2001:db8::7]:65535", "2001:db8::7", 65535),
        ("worker-0.tfdist.svc.cluster.local:2222", "worker-0.tfdist.svc.cluster.local", 2222),
        ("my_host:80", "my_host", 80),
    ],
)
def test_valid_addresses(address, host, port):
    assert cluster.split_address(address) == (host, port)
    assert cluster.parse_cluster_spec({"worker": [address]}, source="s").addresses() == [address]


@pytest.mark.parametrize(
    "obj, match",
    [
        ({1: ["127.0.0.1:2222"]}, r"Unknown task type in cluster spec s\. Received: 1\."),
        ({"worker": ("a:1", "a:1")}, r"Duplicate address"),
        ({"worker": ["A.example:1", "a.example:1"]}, r"Duplicate address .*'a\.example:1'"),  # host names ignore case
        ({"worker": [None]}, r"a NoneType is not a string"),
        ({"worker": [True]}, r"a bool is not a string"),
        ({"worker": ["h:22.5"]}, r"the port '22\.5'"),
        ({"worker": ["h:+22"]}, r"the port '\+22'"),
        ({"worker": ["h:22\t"]}, r"whitespace"),
        ({"worker": ["[::1]:2222:1"]}, r"the port '2222:1'"),
        ({"worker": [""]}, r"no :port\. Received: ''"),
        ({"worker": ["-h:1"]}, r"'-h' is not a host name"),
        ([], r"top level is a list"),
        ({}, r"Empty cluster spec s"),
        (None, r"Empty cluster spec s"),
        ("worker: a:1", r"top level is a str"),
    ],
)
def test_parse_cluster_spec_rejects(obj, match):
    with pytest.raises(UserError, match=match):
        cluster.parse_cluster_spec(obj, source="s")


def test_long_values_are_cut_in_messages():
    with pytest.raises(UserError) as info:
        cluster.parse_cluster_spec({"worker": ["x" * 500]}, source="s")
    assert len(str(info.value)) < 300 and "..." in str(info.value)


# --------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("text, expected", [("chief:0", ("chief", 0)), ("worker:2", ("worker", 2)), ("ps:1", ("ps", 1)), ("evaluator:0", ("evaluator", 0))])
def test_parse_task(text, expected):
    task = cluster.parse_task(text, spec_of("full"))
    assert (task.type, task.index) == expected and task.spec == spec_of("full") and task.name == text


@pytest.mark.parametrize(
    "text, match",
    [
        ("worker", r"Received: task='worker'\. Expected type:index"),
        ("worker:", r"Received: task='worker:'"),
        (":0", r"Received: task=':0'"),
        ("worker:-1", r"non-negative"),
        ("worker:one", r"Received: task='worker:one'"),
        ("worker:1:2", r"Received: task='worker:1:2'"),
        (" worker:1", r"Received: task=' worker:1'"),
        ("worker:3", r"2 `worker` tasks\. Received: task='worker:3'\. Expected an index in 0\.\.1"),
        ("chief:1", r"1 `chief` task\. Received: task='chief:1'\. Expected an index in 0\.\.0"),
        ("ps:0", r"workers_only\.yaml has no `ps` tasks\. Received: task='ps:0'\. Expected one of: worker:0, worker:1"),
        ("Worker:0", r"unknown task type\. Received: task='Worker:0'"),
    ],
)
def test_parse_task_rejects(text, match):
    spec = spec_of("ipv6") if text.startswith("chief") else spec_of("workers_only")
    with pytest.raises(UserError, match=match):
        cluster.parse_task(text, spec)


def test_tf_config_dict_and_json():
    spec = spec_of("workers_only")
    task = Task(spec=spec, type="worker", index=1)
    assert task.tf_config() == {
        "cluster": {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]},
        "task": {"type": "worker", "index": 1},
    }
    text = task.tf_config_json()
    assert " " not in text and json.loads(text) == task.tf_config()


@pytest.mark.parametrize("task_type, index", [("worker", 2), ("ps", 0), ("worker", -1), ("worker", True), ("worker", "0"), ("boss", 0)])
def test_tf_config_rejects_tasks_not_in_cluster(task_type, index):
    with pytest.raises(UserError, match="Invalid task"):
        Task(spec=spec_of("workers_only"), type=task_type, index=index)


# --------------------------------------------------------------------------- the environment


GOOD_ENV = json.dumps({"cluster": {"worker": ["a:1", "b:1"], "chief": ["c:1"]}, "task": {"type": "worker", "index": 1}})


@pytest.mark.parametrize("environ", [{}, {"TF_CONFIG": ""}, {"TF_CONFIG": "  "}, {"TF_CONFIG": "{}"}, {"OTHER": GOOD_ENV}])
def test_from_environment_none(environ):
    assert cluster.from_environment(environ) is None


def test_from_environment_good():
    task = cluster.from_environment({"TF_CONFIG": GOOD_ENV})
    assert task.spec.source == "TF_CONFIG" and task.spec.as_dict() == {"chief": ["c:1"], "worker": ["a:1", "b:1"]}
    assert (task.type, task.index, task.address) == ("worker", 1, "b:1")


def test_from_environment_reads_os_environ_and_extra_keys(monkeypatch):
    tf_config = json.loads(GOOD_ENV) | {"environment": "cloud", "rpc_layer": "grpc"}
    tf_config["task"]["index"] = "1"  # TensorFlow's resolver int()s the index too
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert cluster.from_environment().name == "worker:1"
    monkeypatch.delenv("TF_CONFIG")
    assert cluster.from_environment() is None


@pytest.mark.parametrize(
    "raw, match",
    [
        ("{not json", r"Invalid TF_CONFIG environment variable: not valid JSON .*Received: TF_CONFIG='\{not json'"),
        ('["a:1"]', r"TF_CONFIG environment variable: a list, not a JSON object"),
        ('{"task": {"type": "worker", "index": 0}}', r'TF_CONFIG environment variable: no "cluster" key'),
        ('{"cluster": {"worker": ["a:1"]}}', r'TF_CONFIG environment variable: no "task" key'),
        ('{"cluster": {"worker": ["a:1"]}, "task": "worker:0"}', r'Invalid "task" in TF_CONFIG\. Received: task=\'worker:0\''),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}', r'Invalid "task" in TF_CONFIG'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "x"}}', r"Invalid \"task\" in TF_CONFIG.*'index': 'x'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": true}}', r'Invalid "task" in TF_CONFIG'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}', r"task\" in TF_CONFIG: task index out of range.*Received: task='worker:1'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', r'TF_CONFIG "cluster" has no `ps` tasks'),
        ('{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}', r"Duplicate address in TF_CONFIG"),
        ('{"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}', r'`worker\[0\]` in TF_CONFIG "cluster": no :port'),
        ('{"cluster": {"master": ["a:1"]}, "task": {"type": "master", "index": 0}}', r'Unknown task type in TF_CONFIG "cluster"\. Received: \'master\''),
        ('{"cluster": [], "task": {"type": "worker", "index": 0}}', r'Invalid TF_CONFIG "cluster": its value is a list'),
        ('{"cluster": {}, "task": {"type": "worker", "index": 0}}', r'Empty TF_CONFIG "cluster"\. Received: \{\}'),
        ('{"cluster": {}, "cluster": {"worker": ["a:1"]}, "task": {}}', r"duplicate key 'cluster'"),
    ],
)
def test_from_environment_rejects(raw, match):
    with pytest.raises(UserError, match=match) as info:
        cluster.from_environment({"TF_CONFIG": raw})
    assert "TF_CONFIG" in str(info.value)


def test_resolve_task(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("worker: [127.0.0.1:1, 127.0.0.1:2]\n")
    env = {"TF_CONFIG": GOOD_ENV}
    task = cluster.resolve_task(str(path), "worker:0", environ=env)  # flags win
    assert (task.spec.source, task.type, task.index) == (str(path), "worker", 0)
    task = cluster.resolve_task(None, None, environ=env)
    assert (task.spec.source, task.type, task.index) == ("TF_CONFIG", "worker", 1)
    assert cluster.resolve_task("", "", environ={}) is None
    with pytest.raises(UserError, match=r"Missing `--task` .*Expected type:index, one of: worker:0, worker:1"):
        cluster.resolve_task(str(path), None, environ=env)
    with pytest.raises(UserError, match=r"Missing `--cluster` for --task=worker:0"):
        cluster.resolve_task(None, "worker:0", environ=env)
    with pytest.raises(UserError, match=r"not found"):
        cluster.resolve_task(str(tmp_path / "missing.yaml"), "worker:0")


# --------------------------------------------------------------------------- strategies


@pytest.mark.parametrize(
    "obj, strategy",
    [
        ({"worker": ["a:1"]}, "multi_worker_mirrored"),
        ({"worker": ["a:1", "b:1"]}, "multi_worker_mirrored"),
        ({"chief": "c:1", "worker": ["a:1"], "evaluator": "e:1"}, "multi_worker_mirrored"),
        ({"chief": "c:1", "worker": ["a:1"], "ps": ["p:1"]}, "parameter_server"),
        ({"chief": "c:1", "worker": ["a:1", "b:1"], "ps": ["p:1", "q:1"], "evaluator": "e:1"}, "parameter_server"),
        ({"worker": ["a:1"]}, "one_device"),
        ({"worker": ["a:1"]}, "mirrored"),
        ({"worker": ["a:1"]}, "central_storage"),
    ],
)
def test_check_strategy_accepts(obj, strategy):
    check_strategy(cluster.parse_cluster_spec(obj, source="s"), strategy)


@pytest.mark.parametrize(
    "obj, strategy, match",
    [
        ({"worker": ["a:1"], "ps": ["p:1"]}, "multi_worker_mirrored", r"ps tasks are for parameter_server\. Received: chief=0, worker=1, ps=1"),
        ({"worker": ["a:1"], "ps": ["p:1"]}, "parameter_server", r"missing a chief \(the coordinator\)"),
        ({"chief": "c:1", "worker": ["a:1"]}, "parameter_server", r"missing a ps task\. .*Expected at least one ps"),
        ({"worker": ["a:1"]}, "parameter_server", r"missing a ps task and a chief"),
        ({"worker": ["a:1", "b:1"]}, "one_device", r"one_device runs on one machine\. Received: chief=0, worker=2"),
        ({"worker": ["a:1", "b:1"]}, "mirrored", r"strategy='mirrored' in cluster spec s: mirrored runs on one machine"),
        ({"chief": "c:1", "worker": ["a:1"]}, "central_storage", r"central_storage runs on one machine"),
        ({"worker": ["a:1"]}, "horovod", r"Invalid value for `--strategy`\. Received: strategy='horovod'\. Expected one of: one_device"),
    ],
)
def test_check_strategy_rejects(obj, strategy, match):
    with pytest.raises(UserError, match=match):
        check_strategy(cluster.parse_cluster_spec(obj, source="s"), strategy)


def test_check_strategy_needs_a_worker():
    # parse_cluster_spec already refuses a cluster without workers; a ClusterSpec built directly is checked too.
    spec = ClusterSpec(tasks={"chief": ("c:1",), "ps": ("p:1",)}, source="s")
    with pytest.raises(UserError, match="no worker"):
        check_strategy(spec, "multi_worker_mirrored")
    with pytest.raises(UserError, match="missing a worker"):
        check_strategy(spec, "parameter_server")


# --------------------------------------------------------------------------- addresses


def test_public_addresses():
    spec = cluster.parse_cluster_spec(
        {
            "chief": "8.8.8.8:2222",
            "worker": [
                "10.1.2.3:1", "172.16.0.1:1", "192.168.1.1:1", "127.0.0.1:1", "169.254.0.1:1", "100.64.0.1:1",
                "0.0.0.0:1", "[::1]:2", "[fe80::1]:1", "[fd00::1]:1", "localhost:3", "a.localhost:4",
                "[2001:4860::8888]:1", "trainer.example.com:1", "worker-1:1",
            ],
        },
        source="s",
    )
    assert cluster.public_addresses(spec) == ["8.8.8.8:2222", "[2001:4860::8888]:1", "trainer.example.com:1", "worker-1:1"]
    assert cluster.public_addresses(spec, include_hostnames=False) == ["8.8.8.8:2222", "[2001:4860::8888]:1"]
    assert cluster.public_addresses(cluster.load_cluster_spec(CLUSTERS / "example.yaml")) == []


# --------------------------------------------------------------------------- commands


def test_task_commands_round_trip():
    spec = spec_of("full")
    extra = ["--epochs", "3", "--model_dir", "runs/a b", "it's", "--flag=$(x)"]
    commands = task_commands(spec, "configs/my cluster.yaml", extra)
    assert [(t, i) for t, i, _ in commands] == spec.task_list()
    for task_type, index, command in commands:
        assert "\n" not in command
        assert shlex.split(command) == [
            "python", "-m", "tfdist.train", "--cluster", "configs/my cluster.yaml", "--task", f"{task_type}:{index}", *extra,
        ]
    custom = task_commands(spec, "c.yaml", python="/opt/venv/bin/python", module="tfdist.other")
    assert shlex.split(custom[0][2]) == ["/opt/venv/bin/python", "-m", "tfdist.other", "--cluster", "c.yaml", "--task", "chief:0"]


def test_importing_cluster_does_not_import_tensorflow():
    code = "import sys, tfdist.cluster, tfdist.tfconfig; sys.exit('tensorflow' in sys.modules)"
    assert run_python(code, timeout=60).returncode == 0


def test_keras_fit_asks_the_placement_of_its_strategy():
    import types

    from tfdist.runtime import who

    def strategy(cluster, task_type, task_id):
        spec = types.SimpleNamespace(as_dict=lambda: cluster)
        resolver = types.SimpleNamespace(cluster_spec=lambda: spec, task_type=task_type, task_id=task_id)
        return types.SimpleNamespace(cluster_resolver=resolver)

    workers = {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]}
    second = who.placement_of(strategy(workers, "worker", 1))
    assert (second.name, second.task.slug, second.is_chief) == ("worker:1", "worker-1", False)
    assert who.placement_of(strategy(workers, "worker", 0)).is_chief
    assert who.placement_of(strategy({}, None, None)).task == Task.local()
