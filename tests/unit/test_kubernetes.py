"""``tfdist.manifest --form kubernetes`` / ``--form tfjob``: manifests read back with the Kubernetes client's models.

Every document is deserialized into the client's model of its kind (the
Kubeflow training SDK's ``KubeflowOrgV1TFJob`` for the TFJob) and serialized
again: the client drops fields it does not know, so getting the same document
back proves every field is a field of the model, spelled and typed as the
API server expects. Then each task's TF_CONFIG is read from its Job and
compared with ``tfdist.cluster.Task.tf_config`` on the DNS-renamed spec, and with
what TensorFlow's own resolver makes of it.

No API server runs here, so what the server and the training operator do
with the restart fields is checked against their rules, copied below from
their sources (kubernetes ``pkg/apis/batch/validation``, the Job
controller's first-matching-rule order; training-operator
``pkg/util/train/train_util.go``, current and older), and the TFJob's
wrapper command is run for real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubeflow.training
import kubernetes.client
import pytest
import yaml

from tfdist import cluster
from tfdist.deploy import kubernetes as k8s
from tfdist.deploy import tfjob_entry
from tfdist.errors import (DIVERGED_EXIT_CODE, PEER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE, USAGE_EXIT_CODE,
                           UserError)
from helpers.clis import REPO, assert_user_error, cli_argv, run_cli

CLUSTERS = REPO / "configs" / "clusters"

#: A chief, 2 workers and 1 ps, on hosts and ports as a user would write them for bare machines.
SPEC = {"chief": "10.0.0.1:2222", "worker": ["10.0.0.2:2222", "10.0.0.3:2223"], "ps": ["10.0.0.4:2224"]}

#: (apiVersion, kind) -> (client, model name).
MODELS = {
    ("v1", "Service"): (kubernetes.client.ApiClient, "V1Service"),
    ("batch/v1", "Job"): (kubernetes.client.ApiClient, "V1Job"),
    ("kubeflow.org/v1", "TFJob"): (kubeflow.training.ApiClient, "KubeflowOrgV1TFJob"),
}


def load_model(document: dict):
    """The client model of ``document``; fails unless it serializes back to exactly ``document``."""
    client_class, model = MODELS[(document["apiVersion"], document["kind"])]
    client = client_class()
    obj = client._ApiClient__deserialize(document, model)
    assert client.sanitize_for_serialization(obj) == document, f"fields the {model} model does not know"
    return obj


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("k8s") / "cluster.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


@pytest.fixture(scope="module")
def emitted(spec_file) -> list[dict]:
    """The CLI's manifests for SPEC, as documents."""
    proc = run_cli("tfdist.manifest", "--cluster", str(spec_file), "--form", "kubernetes", "--image",
                   "registry.example.com/tfdist:0.1", "--name", "unet", "--namespace", "ml", "--gpus", "1",
                   "--strategy", "parameter_server", "--", "--epochs", "2", "--model_dir", "/runs/unet")
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def test_every_manifest_is_valid_for_the_client_models(emitted):
    assert [d["kind"] for d in emitted] == ["Service", "Job", "Job", "Job", "Job"]
    for document in emitted:
        load_model(document)
        assert document["metadata"]["namespace"] == "ml"




def validate_pod_failure_policy(document: dict) -> None:
    """The API server's checks of a Job's podFailurePolicy (kubernetes pkg/apis/batch/validation), as asserts."""
    spec = document["spec"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # "only "Never" is supported when podFailurePolicy is specified"
    containers = {c["name"] for c in pod["containers"]}
    rules = spec["podFailurePolicy"]["rules"]
    assert 0 < len(rules) <= 20
    for rule in rules:
        assert rule["action"] in ("FailJob", "Ignore", "Count")  # FailIndex needs backoffLimitPerIndex
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule)  # exactly one of them
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            assert codes["operator"] in ("In", "NotIn") and codes.get("containerName", k8s.CONTAINER) in containers
            values = codes["values"]
            assert 0 < len(values) <= 255 and len(set(values)) == len(values) and values == sorted(values)
            assert codes["operator"] != "In" or 0 not in values
        else:
            assert all(c["status"] in ("True", "False", "Unknown") and c["type"] for c in rule["onPodConditions"])


def job_verdict(document: dict, exit_code: int | None = None, conditions: tuple[str, ...] = ()) -> str:
    """What the Job controller does with a failed pod: the action of the first rule that matches, else Count."""
    for rule in document["spec"]["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes and exit_code is not None and (exit_code in codes["values"]) == (codes["operator"] == "In"):
            return rule["action"]
        if any(c["type"] in conditions and c["status"] == "True" for c in rule.get("onPodConditions", ())):
            return rule["action"]
    return "Count"  # counted against backoffLimit


def test_jobs_fail_at_once_on_tfdists_own_verdicts(emitted):
    """docs/clusters.md: each Job fails at once on exit 2 (a user error) or 3 (a diverged loss), the statuses of
    tfdist.errors; a pod evicted or preempted (DisruptionTarget) does not count against its 3 restarts."""
    from tfdist.errors import TrainingDiverged

    assert (USAGE_EXIT_CODE, DIVERGED_EXIT_CODE, TrainingDiverged.exit_code) == (2, 3, 3)
    for document in emitted[1:]:
        job = load_model(document)
        rules = job.spec.pod_failure_policy.rules
        fail = [r for r in rules if r.action == "FailJob"]
        assert len(fail) == 1 and fail[0].on_exit_codes.operator == "In"
        assert sorted(fail[0].on_exit_codes.values) == [2, 3]
        (container,) = job.spec.template.spec.containers  # the rule reads the exit code of tfdist's container
        assert fail[0].on_exit_codes.container_name == container.name
        assert any(r.action == "Ignore" and r.on_pod_conditions and r.on_pod_conditions[0].type == "DisruptionTarget"
                   for r in rules)


def test_a_preempted_task_is_replaced_without_counting_against_the_backoff_limit(emitted):
    """docs/clusters.md: exit 42 (preempted: a checkpoint was saved) and an eviction start a new pod, not
    counted against the 3 restarts; 2 and 3 fail the Job; any other failure (4: a lost peer, 1: a crash) is counted."""
    for document in emitted[1:]:
        validate_pod_failure_policy(document)
        job = load_model(document)
        (ignore_42,) = [r for r in job.spec.pod_failure_policy.rules if r.on_exit_codes and r.action == "Ignore"]
        assert ignore_42.on_exit_codes.values == [PREEMPTED_EXIT_CODE] and ignore_42.on_exit_codes.operator == "In"
        assert ignore_42.on_exit_codes.container_name == job.spec.template.spec.containers[0].name
        verdicts = {code: job_verdict(document, code) for code in
                    (USAGE_EXIT_CODE, DIVERGED_EXIT_CODE, PREEMPTED_EXIT_CODE, PEER_LOST_EXIT_CODE, 1, 137)}
        assert verdicts == {2: "FailJob", 3: "FailJob", 42: "Ignore", 4: "Count", 1: "Count", 137: "Count"}
        # evicted or preempted by the cluster: ignored whatever the container's status (e.g. SIGKILL after the grace)
        assert job_verdict(document, 137, conditions=("DisruptionTarget",)) == "Ignore"
        assert job_verdict(document, 42, conditions=("DisruptionTarget",)) == "Ignore"
        assert document["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == k8s.TERMINATION_GRACE_SECONDS


def operator_retries(exit_code: int) -> dict[str, bool]:
    """Whether the training operator's restartPolicy ExitCode recreates the pod (training-operator's
    IsRetryableExitCode), in its current version and in older ones."""
    return {"current": exit_code >= 128, "older": exit_code in (130, 137, 138, 143)}


def test_tfjob_maps_preempted_to_a_status_the_operator_retries():
    """42 is permanent to the operator, so the container's wrapper exits 138, retried by every version; 2, 3 stay
    permanent (the TFJob fails), as do 42 and 4 if left alone (hence the wrapper)."""
    assert operator_retries(tfjob_entry.TFJOB_PREEMPTED_EXIT_CODE) == {"current": True, "older": True}
    for code in (USAGE_EXIT_CODE, DIVERGED_EXIT_CODE, PREEMPTED_EXIT_CODE):
        assert operator_retries(code) == {"current": False, "older": False}


def run_wrapper(*child: str, **popen) -> subprocess.Popen:
    """The TFJob container's command with ``child`` in place of ``python -m tfdist.train``."""
    return subprocess.Popen(cli_argv("tfdist.deploy.tfjob_entry", *child), cwd=REPO, **popen)


@pytest.mark.parametrize("status, expected", [(0, 0), (USAGE_EXIT_CODE, 2), (DIVERGED_EXIT_CODE, 3),
                                              (PEER_LOST_EXIT_CODE, 4), (PREEMPTED_EXIT_CODE, 138), (1, 1)])
def test_tfjob_wrapper_passes_statuses_on_and_turns_42_into_138(status, expected):
    proc = run_wrapper(sys.executable, "-c", f"import sys; sys.exit({status})")
    assert proc.wait(timeout=60) == expected


def test_tfjob_wrapper_without_a_command_or_with_a_missing_one_is_one_line():
    proc = run_wrapper(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert_user_error((proc.returncode, out, err), r"^error: Missing command")
    proc = run_wrapper("no-such-command-tfdist", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 127 and err.startswith("error: Cannot start 'no-such-command-tfdist'")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_tfjob_wrapper_reports_a_killed_child_as_a_shell_does():
    proc = run_wrapper(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL  # 137: retried by the operator, as a pod killed outright


CHILD_SAVES_ON_SIGNAL = r"""
import os, signal, sys, time
def preempted(signum, frame):
    sys.stdout.write(f"saved after {signal.Signals(signum).name}\n"); sys.stdout.flush()
    sys.exit(42)
signal.signal(signal.SIGTERM, preempted)
signal.signal(signal.SIGUSR1, preempted)
open(sys.argv[1], "w").close()  # ready: the handlers are installed
time.sleep(60)
sys.exit(0)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_tfjob_wrapper_passes_the_preemption_signal_to_tfdist(tmp_path, signum):
    """The kubelet signals the container's first process, the wrapper: the child must get the signal to save."""
    ready = tmp_path / "ready"
    proc = run_wrapper(sys.executable, "-c", CHILD_SAVES_ON_SIGNAL, str(ready), stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signum)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == tfjob_entry.TFJOB_PREEMPTED_EXIT_CODE and out == f"saved after {signum.name}\n"


def test_tfjob_wrapper_runs_the_real_train_cli():
    """A user error of tfdist.train (status 2, one line) comes out of the wrapper unchanged: permanent to the operator."""
    proc = run_wrapper(*cli_argv("tfdist.train", "--strategy", "one_device", "--ps_shards", "2"),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert_user_error((proc.returncode, out, err))


def test_tfjob_has_the_specs_replicas(spec_file):
    proc = run_cli("tfdist.manifest", "--cluster", str(spec_file), "--form", "tfjob", "--image", "img:1", "--name",
                   "unet", "--cpu", "500m", "--memory", "1.5Gi", "--", "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    (document,) = yaml.safe_load_all(proc.stdout)
    job = load_model(document)
    assert (job.api_version, job.kind, job.metadata.name) == ("kubeflow.org/v1", "TFJob", "unet")
    assert job.metadata.namespace is None  # no --namespace: kubectl's
    assert job.spec.run_policy.clean_pod_policy == "Running" and job.spec.run_policy.backoff_limit == 3
    replicas = job.spec.tf_replica_specs
    assert {t: r.replicas for t, r in replicas.items()} == {"Chief": 1, "Worker": 2, "PS": 1}
    # What the training operator makes of it: hosts <name>-<type>-<i>.<namespace>.svc, the tfjob-port.
    operator_cluster = {}
    for replica_type, replica in replicas.items():
        (container,) = replica.template.spec.containers
        assert container.name == "tensorflow" and replica.restart_policy == "ExitCode"
        assert container.command == ["python", "-m", "tfdist.deploy.tfjob_entry", "python", "-m", "tfdist.train"]
        assert replica.template.spec.termination_grace_period_seconds == k8s.TERMINATION_GRACE_SECONDS
        assert not container.env  # the operator sets TF_CONFIG
        assert container.args == ["--strategy", "parameter_server", "--epochs", "2"]  # chosen: the spec has ps
        assert container.resources.requests == {"cpu": "500m", "memory": "1.5Gi"}
        (port,) = [p.container_port for p in container.ports if p.name == "tfjob-port"]
        task_type = replica_type.lower()
        operator_cluster[task_type] = [f"unet-{task_type}-{i}.default.svc:{port}" for i in range(replica.replicas)]
    operator_spec = cluster.parse_cluster_spec(operator_cluster, source="operator")
    assert operator_spec.task_list() == cluster.parse_cluster_spec(SPEC, source="s").task_list()
    assert operator_spec.tasks["worker"] == ("unet-worker-0.default.svc:2222", "unet-worker-1.default.svc:2222")


def test_output_file_defaults_and_every_example_cluster(tmp_path):
    for example in sorted(CLUSTERS.glob("*.yaml")):
        for emit in k8s.EMITS:
            out = tmp_path / f"{example.stem}-{emit}.yaml"
            proc = run_cli("tfdist.manifest", "--cluster", str(example), "--form", emit, "--image", "img", "--output",
                           str(out))
            assert proc.returncode == 0 and proc.stdout == "", proc.stderr
            documents = list(yaml.safe_load_all(out.read_text()))
            assert "&id" not in out.read_text()  # labels written out, not as YAML aliases
            for document in documents:
                load_model(document)
                if document["kind"] == "Job":
                    validate_pod_failure_policy(document)
    mwm = list(yaml.safe_load_all((tmp_path / "local_mwm-kubernetes.yaml").read_text()))
    assert mwm[1]["spec"]["template"]["spec"]["containers"][0]["args"] == ["--strategy", "multi_worker_mirrored"]
    assert mwm[1]["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}  # the defaults of --cpu and --memory
    }
    assert "namespace" not in mwm[0]["metadata"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"image": ""}, r"Invalid value for `--image`: empty or with spaces\. Received: image=''"),
        ({"image": "my image"}, r"Received: image='my image'"),
        ({"name": "Unet"}, r"`--name`: not a DNS-1035 label\. Received: name='Unet'"),
        ({"name": "1unet"}, r"not a DNS-1035 label"),
        ({"name": "unet-"}, r"not a DNS-1035 label"),
        ({"name": "a" * 60}, r"the task host name 'a+-worker-0' is 69 characters"),
        ({"namespace": "ML_team"}, r"`--namespace`: not a DNS-1123 label"),
        ({"cpu": "two"}, r"`--cpu`: not a Kubernetes quantity\. Received: cpu='two'"),
        ({"memory": "4GB"}, r"`--memory`: not a Kubernetes quantity"),
        ({"gpus": -1}, r"`--gpus`: not a count"),
        ({"strategy": "multi_worker_mirrored"}, r"ps tasks are for parameter_server"),
    ],
)
def test_bad_arguments_are_user_errors(kwargs, match):
    spec = cluster.parse_cluster_spec(SPEC, source="s")
    deployment = k8s.Deployment(**{"image": "img", "strategy": "parameter_server", **kwargs})
    for build in (k8s.manifests, k8s.tfjob):
        with pytest.raises(UserError, match=match) as info:
            build(spec, deployment)
        assert "\n" not in str(info.value)


def test_name_length_limit_is_the_longest_host_name():
    spec = cluster.parse_cluster_spec({"worker": "a:1", "evaluator": "b:1"}, source="s")
    k8s.check_name("a" * (63 - len("-evaluator-0")), spec)
    with pytest.raises(UserError, match=r"'a+-evaluator-0' is 64 characters"):
        k8s.check_name("a" * (64 - len("-evaluator-0")), spec)
