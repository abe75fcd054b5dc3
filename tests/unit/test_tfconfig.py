"""`python -m tfdist.tfconfig`: output formats, and every user error as exit 2 + one line.

Every malformed cluster spec below is checked twice: against the library
(``load_cluster_spec``/``parse_task`` raise ``UserError``) and through the CLI
as a real subprocess. The subprocesses are started all at once by a
module-scoped fixture (tfconfig does not import TensorFlow, so each is quick).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tfdist import cluster, strategies
from tfdist.errors import UserError
from helpers.clis import REPO, assert_user_error, cli_argv, run_cli, run_python, start_cli

CLUSTERS = REPO / "configs" / "clusters"
GOOD_YAML = "chief: 127.0.0.1:2222\nworker: [127.0.0.1:2223, 127.0.0.1:2224]\nps: [127.0.0.1:2225]\n"


@dataclass(frozen=True)
class Bad:
    """One malformed input: a file (name, content; None: absent) and the task asked for."""

    name: str
    content: str | bytes | None
    match: str  # a regex the one-line message must contain (names key/value)
    task: str = "worker:0"
    kind: str = "spec"  # "spec": load_cluster_spec fails; "task": parse_task fails


MALFORMED = {
    "missing_file": Bad("nope.yaml", None, r"not found\. Received: '.*nope\.yaml'"),
    "directory": Bad("dir.yaml", "<dir>", r"is a directory\. Received: '.*dir\.yaml'"),
    "unknown_extension": Bad("cluster.txt", GOOD_YAML, r"extension '\.txt'.*Expected a file ending in \.yaml"),
    "no_extension": Bad("cluster", GOOD_YAML, r"extension 'none'"),
    "not_utf8": Bad("bin.yaml", b"worker: [\xff\xfe]\n", r"not UTF-8"),
    "empty_yaml": Bad("empty.yaml", "", r"Empty cluster spec file .*empty\.yaml"),
    "only_comments_yaml": Bad("comments.yaml", "# nothing here\n", r"Empty cluster spec .*Received: None"),
    "empty_json": Bad("empty.json", "  \n", r"Empty cluster spec file .*empty\.json"),
    "empty_mapping_json": Bad("empty_obj.json", "{}", r"Empty cluster spec .*Received: \{\}"),
    "invalid_yaml": Bad("bad.yaml", "worker: [127.0.0.1:2222\n", r"Invalid YAML in cluster spec file .*bad\.yaml.* line \d+"),
    "invalid_json": Bad("bad.json", '{"worker": ["127.0.0.1:2222",', r"Invalid JSON in cluster spec file .*bad\.json.* line 1"),
    "duplicate_key_yaml": Bad("dupkey.yaml", "worker: 127.0.0.1:1\nworker: 127.0.0.1:2\n", r"duplicate key 'worker'"),
    "duplicate_key_json": Bad("dupkey.json", '{"worker": "a:1", "worker": "b:1"}', r"duplicate key 'worker'"),
    "top_level_list": Bad("list.yaml", "- 127.0.0.1:2222\n", r"top level is a list\. Received: \['127\.0\.0\.1:2222'\]"),
    "top_level_string": Bad("str.json", '"127.0.0.1:2222"', r"top level is a str"),
    "unknown_type": Bad("master.yaml", "master: [127.0.0.1:2222]\nworker: 127.0.0.1:2223\n",
                        r"Unknown task type .*Received: 'master'\. Expected one of: chief, worker, ps, evaluator"),
    "plural_type": Bad("workers.yaml", "workers: [127.0.0.1:2222]\n", r"Received: 'workers'"),
    "no_port": Bad("noport.yaml", "worker: [127.0.0.1]\n", r"`worker\[0\]`.*no :port\. Received: '127\.0\.0\.1'"),
    "port_not_int": Bad("portabc.yaml", "worker: [h:abc]\n", r"the port 'abc' is not an integer in 1\.\.65535\. Received: 'h:abc'"),
    "port_zero": Bad("port0.yaml", "worker: [127.0.0.1:0]\n", r"the port '0' .*Received: '127\.0\.0\.1:0'"),
    "port_too_big": Bad("port65536.yaml", "worker: [127.0.0.1:65536]\n", r"the port '65536'"),
    "port_negative": Bad("portneg.yaml", "worker: [127.0.0.1:2222, 'h:-5']\n", r"`worker\[1\]`.*the port '-5'"),
    "empty_host": Bad("nohost.yaml", "worker: [':2222']\n", r"the host is empty\. Received: ':2222'"),
    "whitespace": Bad("space.yaml", "worker: ['127.0.0.1 :2222']\n", r"whitespace\. Received: '127\.0\.0\.1 :2222'"),
    "int_entry": Bad("int.yaml", "worker: [2222]\n", r"`worker\[0\]`.*an int is not a string\. Received: 2222"),
    "int_value": Bad("intvalue.yaml", "worker: 2222\n", r"`worker`.*an int is not a string\. Received: 2222"),
    "nested_list": Bad("nested.yaml", "worker: [[127.0.0.1:2222]]\n", r"a list is not a string"),
    "mapping_value": Bad("map.yaml", "worker: {host: 127.0.0.1, port: 2222}\n", r"`worker`.*a mapping\. Received: worker=\{"),
    "ipv6_no_brackets": Bad("v6.yaml", "worker: ['::1:2222']\n", r"IPv6 host must be written in brackets"),
    "ipv6_bad": Bad("v6bad.yaml", "worker: ['[zz::1]:2222']\n", r"'zz::1' is not an IPv6 address"),
    "ipv6_no_port": Bad("v6noport.yaml", "worker: ['[::1]']\n", r"followed by :port\. Received: '\[::1\]'"),
    "bad_ipv4": Bad("v4bad.yaml", "worker: [300.1.1.1:2222]\n", r"'300\.1\.1\.1' is not an IPv4 address"),
    "url": Bad("url.yaml", "worker: ['grpc://10.0.0.1:2222']\n", r"URL scheme"),
    "bad_host_chars": Bad("hostchars.yaml", "worker: ['a/b:2222']\n", r"'a/b' is not a host name"),
    "duplicate_address": Bad("dup.yaml", "worker: [127.0.0.1:2222, 127.0.0.1:2222]\n",
                             r"Duplicate address .*Received: '127\.0\.0\.1:2222' for both `worker\[0\]` and `worker\[1\]`"),
    "duplicate_across_types": Bad("dup2.yaml", "chief: 127.0.0.1:2222\nworker: [127.0.0.1:2223]\nps: ['127.0.0.1:2222']\n",
                                  r"for both `chief` and `ps\[0\]`"),
    "duplicate_ipv6_forms": Bad("dup6.json", '{"worker": ["[::1]:2222", "[0:0::1]:2222"]}', r"Duplicate address"),
    "two_chiefs": Bad("chiefs.yaml", "chief: [127.0.0.1:1, 127.0.0.1:2]\nworker: 127.0.0.1:3\n",
                      r"Too many `chief` tasks .*Received: 2 .*Expected exactly one chief"),
    "two_evaluators": Bad("evals.yaml", "evaluator: [127.0.0.1:1, 127.0.0.1:2]\nworker: 127.0.0.1:3\n",
                          r"Too many `evaluator` tasks"),
    "no_worker": Bad("noworker.yaml", "chief: 127.0.0.1:2222\nps: [127.0.0.1:2223]\n",
                     r"No `worker` .*Received task types: chief, ps\. Expected at least one worker"),
    "empty_list": Bad("emptylist.yaml", "worker: []\n", r"Empty task list for `worker` .*Received: worker=\[\]"),
    "null_value": Bad("null.yaml", "chief: 127.0.0.1:2222\nworker:\n", r"Empty task list for `worker` .*Received: worker=None"),
    "task_out_of_range": Bad("ok1.yaml", GOOD_YAML, r"index out of range.*2 `worker` tasks\. Received: task='worker:2'\. Expected an index in 0\.\.1", task="worker:2", kind="task"),
    "task_type_absent": Bad("ok2.yaml", "worker: [127.0.0.1:2222]\n", r"has no `ps` tasks\. Received: task='ps:0'\. Expected one of: worker:0", task="ps:0", kind="task"),
    "task_unknown_type": Bad("ok3.yaml", GOOD_YAML, r"unknown task type\. Received: task='master:0'", task="master:0", kind="task"),
    "task_no_index": Bad("ok4.yaml", GOOD_YAML, r"Received: task='worker'\. Expected type:index", task="worker", kind="task"),
    "task_negative": Bad("ok5.yaml", GOOD_YAML, r"Received: task='worker:-1'\. Expected type:index with a non-negative", task="worker:-1", kind="task"),
    "task_not_integer": Bad("ok6.yaml", GOOD_YAML, r"Received: task='worker:1\.5'", task="worker:1.5", kind="task"),
}


def write_case(tmp: Path, bad: Bad) -> Path:
    path = tmp / bad.name
    if bad.content == "<dir>":
        path.mkdir()
    elif isinstance(bad.content, bytes):
        path.write_bytes(bad.content)
    elif bad.content is not None:
        path.write_text(bad.content)
    return path


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_library_rejects(case, tmp_path):
    bad = MALFORMED[case]
    path = write_case(tmp_path, bad)
    with pytest.raises(UserError, match=bad.match) as info:
        spec = cluster.load_cluster_spec(path)
        assert bad.kind == "task", "the spec should have been rejected"
        cluster.parse_task(bad.task, spec)
    assert "\n" not in str(info.value) and "Expected" in str(info.value)


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """Run the CLI on every malformed case at once; case -> (returncode, stdout, stderr)."""
    tmp = tmp_path_factory.mktemp("malformed")
    procs = {}
    for case, bad in MALFORMED.items():
        path = write_case(tmp, bad)
        procs[case] = start_cli("tfdist.tfconfig", "--cluster", str(path), "--task", bad.task)
    results = {}
    for case, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        results[case] = (proc.returncode, out, err)
    return results


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_cli_rejects(case, cli_results):
    assert_user_error(cli_results[case], match=MALFORMED[case].match)


@dataclass(frozen=True)
class Near:
    """A valid input next to a malformed case: a file (name, content), the task, and the cluster it holds."""

    name: str
    content: str
    cluster: dict
    task: str = "worker:0"


GOOD = {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"], "ps": ["127.0.0.1:2225"]}

#: For a malformed case (by name), its nearest valid input: what the CLI must accept.
NEAR_MISSES = {
    "unknown_extension": Near("cluster.yml", GOOD_YAML, GOOD),
    "invalid_json": Near("c.json", '{"worker": ["127.0.0.1:2222"]}', {"worker": ["127.0.0.1:2222"]}),
    "only_comments_yaml": Near("comments.yaml", "# a comment\nworker: [127.0.0.1:2222]  # another\n",
                               {"worker": ["127.0.0.1:2222"]}),
    "duplicate_key_yaml": Near("twokeys.yaml", "worker: 127.0.0.1:1\nps: 127.0.0.1:2\n",
                               {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}),
    "int_value": Near("string.yaml", "worker: 127.0.0.1:2222\n", {"worker": ["127.0.0.1:2222"]}),
    "port_zero": Near("port1.yaml", "worker: [127.0.0.1:1]\n", {"worker": ["127.0.0.1:1"]}),
    "port_too_big": Near("port65535.yaml", "worker: [127.0.0.1:65535]\n", {"worker": ["127.0.0.1:65535"]}),
    "ipv6_no_brackets": Near("v6.yaml", "worker: ['[::1]:2222']\n", {"worker": ["[::1]:2222"]}),
    "bad_ipv4": Near("v4.yaml", "worker: [255.255.255.254:2222]\n", {"worker": ["255.255.255.254:2222"]}),
    "bad_host_chars": Near("dns.yaml", "worker: [unet-worker-0.unet.svc.cluster.local:2222]\n",
                           {"worker": ["unet-worker-0.unet.svc.cluster.local:2222"]}),
    "duplicate_address": Near("ports.yaml", "worker: [127.0.0.1:2222, 127.0.0.1:2223]\n",
                              {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}),
    "duplicate_across_types": Near("hosts.yaml", "worker: [127.0.0.1:2222]\nps: [10.0.0.2:2222]\n",
                                   {"worker": ["127.0.0.1:2222"], "ps": ["10.0.0.2:2222"]}),
    "two_chiefs": Near("chief.yaml", "chief: [127.0.0.1:1]\nworker: 127.0.0.1:3\n",
                       {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:3"]}, task="chief:0"),
    "two_evaluators": Near("evaluator.yaml", "evaluator: 127.0.0.1:1\nworker: 127.0.0.1:3\n",
                           {"evaluator": ["127.0.0.1:1"], "worker": ["127.0.0.1:3"]}, task="evaluator:0"),
    "task_out_of_range": Near("last.yaml", GOOD_YAML, GOOD, task="worker:1"),
    "task_type_absent": Near("ps.yaml", GOOD_YAML, GOOD, task="ps:0"),
}


def test_the_nearest_valid_input_of_a_malformed_case_is_accepted(tmp_path):
    """The refusals above are about each defect: the CLI accepts the valid input next to it (the boundary
    port, brackets, one chief, another host, the last index...) and prints its TF_CONFIG."""
    assert set(NEAR_MISSES) <= set(MALFORMED)
    procs = {}
    for case, near in NEAR_MISSES.items():
        (tmp_path / case).mkdir()
        path = tmp_path / case / near.name
        path.write_text(near.content)
        procs[case] = start_cli("tfdist.tfconfig", "--cluster", str(path), "--task", near.task)
    for case, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        near = NEAR_MISSES[case]
        assert proc.returncode == 0 and err == "", (case, err)
        task_type, index = near.task.split(":")
        assert json.loads(out) == {"cluster": near.cluster, "task": {"type": task_type, "index": int(index)}}, case


# --------------------------------------------------------------------------- outputs


def test_json_output_is_tf_config():
    path = CLUSTERS / "example.yaml"
    spec = cluster.load_cluster_spec(path)
    out = run_cli("tfdist.tfconfig", "--cluster", str(path), "--task", "worker:1", check=True).stdout
    assert out.count("\n") == 1 and " " not in out.strip()  # compact, one line
    assert json.loads(out) == cluster.Task(spec=spec, type="worker", index=1).tf_config()
    assert json.loads(out) == {
        "cluster": {
            "chief": ["10.0.0.1:2222"],
            "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
            "ps": ["10.0.0.4:2222"],
            "evaluator": ["10.0.0.5:2222"],
        },
        "task": {"type": "worker", "index": 1},
    }


def test_json_file_and_strategy_check(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"worker": ["[::1]:2222", "[::1]:2223"]}))
    out = run_cli("tfdist.tfconfig", "--cluster", str(path), "--task", "worker:0", "--strategy",
                  "multi_worker_mirrored", check=True)
    assert json.loads(out.stdout)["cluster"] == {"worker": ["[::1]:2222", "[::1]:2223"]}


def test_export_evaluates_in_bash(tmp_path):
    path = tmp_path / "my cluster's.yaml"  # a space and a quote in the path
    path.write_text(GOOD_YAML)
    spec = cluster.load_cluster_spec(path)
    cmd = cli_argv("tfdist.tfconfig", "--cluster", str(path), "--task", "ps:0", "--export")
    script = f'eval "$({shlex.join(cmd)})"; printf %s "$TF_CONFIG"'
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == cluster.Task(spec=spec, type="ps", index=0).tf_config()
    assert proc.stdout == cluster.Task(spec=spec, type="ps", index=0).tf_config_json()
    exported = run_cli("tfdist.tfconfig", "--cluster", str(path), "--task", "ps:0", "--export", check=True).stdout
    assert exported.startswith("export TF_CONFIG='")


def parse_commands(stdout: str) -> list[tuple[str, str, list[str]]]:
    """Pairs of lines: '# type:i on host', then a command; returns (task, host, argv)."""
    lines = stdout.splitlines()
    assert len(lines) % 2 == 0, stdout
    pairs = []
    for comment, command in zip(lines[::2], lines[1::2]):
        match = re.fullmatch(r"# (\w+:\d+) on (\S+)", comment)
        assert match, comment
        pairs.append((match.group(1), match.group(2), shlex.split(command)))
    return pairs


def test_commands_name_every_task_and_round_trip(tmp_path):
    path = tmp_path / "dir with space" / "c.yaml"
    path.parent.mkdir()
    path.write_text((CLUSTERS / "example.yaml").read_text())
    spec = cluster.load_cluster_spec(path)
    extra = ["--epochs", "2", "--model_dir", "runs/it's here", "--data_dir", "$HOME;rm -rf /"]  # quoted, as tfdist.train takes it
    out = run_cli("tfdist.tfconfig", "--cluster", str(path), "--commands", "--strategy", "parameter_server", "--",
                  *extra, check=True)
    pairs = parse_commands(out.stdout)
    assert [task for task, _, _ in pairs] == [f"{t}:{i}" for t, i in spec.task_list()]
    for (task, host, argv), address in zip(pairs, spec.addresses()):
        assert address.startswith(host + ":")
        assert argv == [
            "python", "-m", "tfdist.train", "--cluster", str(path), "--task", task,
            "--strategy", "parameter_server", *extra,
        ]


def test_commands_for_one_task_and_ipv6_host(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("worker: ['[::1]:2222', '[::1]:2223']\n")
    pairs = parse_commands(run_cli("tfdist.tfconfig", "--cluster", str(path), "--commands", "--task", "worker:1",
                                   check=True).stdout)
    assert pairs == [("worker:1", "::1", ["python", "-m", "tfdist.train", "--cluster", str(path), "--task", "worker:1"])]


def test_example_configs_load():
    names = sorted(p.name for p in CLUSTERS.glob("*.yaml"))
    assert {"example.yaml", "local_mwm.yaml", "local_ps.yaml"} <= set(names)
    mwm = cluster.load_cluster_spec(CLUSTERS / "local_mwm.yaml")
    assert mwm.as_dict().keys() == {"worker"} and mwm.count("worker") == 2
    strategies.check_strategy(mwm, "multi_worker_mirrored")
    ps = cluster.load_cluster_spec(CLUSTERS / "local_ps.yaml")
    assert [ps.count(t) for t in cluster.TASK_TYPES] == [1, 2, 1, 0]
    strategies.check_strategy(ps, "parameter_server")
    for spec in (mwm, ps):
        assert all(a.startswith("127.0.0.1:") for a in spec.addresses())
        assert cluster.public_addresses(spec) == []


# --------------------------------------------------------------------------- flag errors

FORM_PS = ("--cluster", str(CLUSTERS / "local_ps.yaml"), "--form", "kubernetes")


@pytest.mark.parametrize(
    "args, match",
    [
        ((), r"Missing `--cluster`"),
        (("--task", "worker:0"), r"Missing `--cluster`"),
        (("--cluster", str(CLUSTERS / "local_ps.yaml")), r"Missing `--task` .*Expected type:index, one of: chief:0, worker:0"),
        (("--cluster", str(CLUSTERS / "local_ps.yaml"), "--task", "worker:0", "--export", "--commands"), r"--export.*--commands"),
        (("--cluster", str(CLUSTERS / "local_ps.yaml"), "--task", "worker:0", "stray"), r"Unexpected arguments\. Received: 'stray'"),
        (("--cluster", str(CLUSTERS / "local_ps.yaml"), "--task", "worker:0", "--strategy", "mirored"),
         r"Received: strategy='mirored'\. Expected one of: one_device, mirrored"),
        (("--cluster", str(CLUSTERS / "local_ps.yaml"), "--commands", "--strategy", "multi_worker_mirrored"),
         r"strategy='multi_worker_mirrored' .*local_ps\.yaml.*Received: chief=1, worker=2, ps=1"),
        (("--cluster", str(CLUSTERS / "local_mwm.yaml"), "--task", "worker:0", "--strategy", "mirrored"),
         r"strategy='mirrored' .*one machine"),
        (("--no_such_flag",), r"Unknown command line flag 'no_such_flag'"),
        (("--export=maybe",), r"invalid command line"),
        ((*FORM_PS[:2], "--task", "worker:0", "--image", "img"), r"Unknown command line flag 'image'"),
        ((*FORM_PS[:2], "--task", "worker:0", "--slurm_tasks", "worker=2"), r"Unexpected `--slurm_tasks` without --cluster=slurm"),
        ((*FORM_PS[:2], "--commands", "--", "--epochz", "3"),
         r"Invalid tfdist\.train arguments after --: Unknown command line flag 'epochz'.*for every task of --commands"),
    ],
    ids=["nothing", "task_only", "no_task", "export_and_commands", "stray_arg", "unknown_strategy", "mwm_with_ps",
         "mirrored_cluster", "unknown_flag", "bad_bool", "image_is_the_manifests", "slurm_tasks_without_slurm",
         "commands_unknown_flag"],
)
def test_cli_flag_errors(args, match):
    assert_user_error(run_cli("tfdist.tfconfig", *args), match)


@pytest.mark.parametrize(
    "args, match",
    [
        (FORM_PS, r"Missing `--image` for --form=kubernetes\. Received: image=None"),
        ((*FORM_PS[:3], "helm", "--image", "img"), r"Invalid value for `--form`\. Received: form='helm'\. Expected one of: kubernetes, tfjob"),
        ((*FORM_PS, "--image", "img", "--name", "My_Run"), r"`--name`: not a DNS-1035 label\. Received: name='My_Run'"),
        ((*FORM_PS, "--image", "img", "--name", "r" * 60), r"`--name`: the task host name 'r+-worker-0' is 69 characters"),
        ((*FORM_PS, "--image", "img", "--namespace", "-ml"), r"`--namespace`: not a DNS-1123 label"),
        ((*FORM_PS, "--image", "img", "--memory", "lots"), r"`--memory`: not a Kubernetes quantity\. Received: memory='lots'"),
        ((*FORM_PS, "--image", "img", "--gpus", "two"), r"invalid command line.*gpus"),
        ((*FORM_PS, "--image", "img", "--task", "worker:0"), r"Unknown command line flag 'task'"),
        ((*FORM_PS, "--image", "img", "--commands"), r"Unknown command line flag 'commands'"),
        ((*FORM_PS, "--image", "img", "--strategy", "multi_worker_mirrored"), r"ps tasks are for parameter_server"),
        ((*FORM_PS, "--image", "img", "--output", "/nonexistent/dir/m.yaml"), r"Cannot write `--output`: .*'/nonexistent/dir/m\.yaml'"),
        ((*FORM_PS, "--image", "img", "--", "--epochz", "3"),
         r"^error: Invalid tfdist\.train arguments after --: Unknown command line flag 'epochz'.*Received: -- --epochz 3\. "
         r"Expected tfdist\.train flags .*tfdist\.manifest --form kubernetes"),
        ((*FORM_PS, "--image", "img", "--", "--epochs", "zero"), r"Invalid tfdist\.train arguments after --: .*epochs"),
        ((*FORM_PS, "--image", "img", "--", "--epochs", "3", "extra"),
         r"Unexpected arguments after --: 'extra' is not a flag\. Received: -- --epochs 3 extra"),
        ((*FORM_PS, "--image", "img", "--", "--task", "worker:0"),
         r"Unexpected `--task` after --: tfdist\.manifest --form kubernetes gives every task its own place in the cluster"),
        ((*FORM_PS, "--image", "img", "--", "--cluster", "c.yaml"), r"Unexpected `--cluster` after --"),
        ((*FORM_PS, "--image", "img", "--", "--strategy", "one_device"),
         r"Invalid `--strategy` after --: it contradicts the deployment's --strategy=parameter_server\."),
        ((*FORM_PS, "--image", "img", "--", "--image_size", "30"), r"Received: image_size=30 with depth=3"),
        ((*FORM_PS, "--image", "Registry.example.com/TFDIST:0.1"),
         r"Invalid value for `--image`: the repository must be lowercase.*Received: image='Registry\.example\.com/TFDIST"),
        ((*FORM_PS, "--image", "https://registry.example.com/tfdist:0.1"), r"`--image`: a URL, not an image reference"),
        ((*FORM_PS, "--image", "registry.example.com/tfdist:"), r"`--image`: its tag is empty"),
        (("--form", "kubernetes", "--image", "img"), r"Invalid value for `--cluster`\. Received: cluster=None"),
        (("--cluster", "slurm", "--image", "img"), r"Invalid value for `--cluster`\. Received: cluster='slurm'"),
    ],
    ids=["no_image", "bad_form", "name_not_dns", "name_too_long", "bad_namespace", "bad_memory", "gpus_not_integer",
         "task", "commands", "strategy_mismatch", "output_unwritable", "command_unknown_flag", "command_bad_value",
         "command_positional", "command_task", "command_cluster", "command_strategy", "command_bad_config",
         "image_uppercase", "image_url", "image_empty_tag", "no_cluster", "environment_cluster"],
)
def test_manifest_flag_errors(args, match):
    assert_user_error(run_cli("tfdist.manifest", *args), match)


def test_console_entry_point_and_no_tensorflow():
    code = (
        "import sys; from tfdist import tfconfig; "
        f"sys.argv = ['tfdist-tfconfig', '--cluster', {str(CLUSTERS / 'local_mwm.yaml')!r}, '--task', 'worker:1']\n"
        "try:\n    tfconfig.entry()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'tensorflow' not in sys.modules, 'tfconfig imported tensorflow'\n"
    )
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["task"] == {"type": "worker", "index": 1}
