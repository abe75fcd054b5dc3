"""``tfdist.manifest --form jobset`` / ``trainjob`` / ``volcano`` and ``--cluster kubernetes``, checked without a cluster.

Every manifest is validated against its resource's own published CRD schema
(tests/unit/k8s_schemas, with the source of each), made strict as the API server's
field validation is (an unknown field is an error), and its pod templates are
read back with the Kubernetes client's models. Then each controller is played
as its sources say it behaves: every pod gets the host name, labels and
variables that JobSet (through the Job controller) or Volcano's ``tensorflow``
plugin would give it, runs the task resolution of its container's own
command, and must find the TF_CONFIG that ``tfdist.tfconfig --task`` prints
for that task of the cluster the controller names. DNS, gang admission and
restarts happen only on a real cluster (docs/kubernetes.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import kubernetes.client
import pytest
import yaml

from helpers.clis import REPO, assert_user_error, run_cli, start_cli
from tfdist.cluster import kubernetes as pod_source
from tfdist.cluster import sources
from tfdist.errors import UserError

SCHEMAS = Path(__file__).resolve().parent / "k8s_schemas"
NAME = "unet"

#: A cluster for every strategy, as a user writes one for bare machines (ports differ; Kubernetes uses the leader's).
SPECS = {
    "parameter_server": {"chief": "10.0.0.1:2222", "worker": ["10.0.0.2:2222", "10.0.0.3:2223"], "ps": "10.0.0.4:2224"},
    "multi_worker_mirrored": {"chief": "10.0.0.1:3333", "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
                              "evaluator": "10.0.0.5:2222"},
    "mirrored": {"worker": "10.0.0.2:2222"},
    "central_storage": {"worker": "10.0.0.2:2222"},
    "one_device": {"worker": "10.0.0.2:2222"},
}
FORMS = ("jobset", "trainjob", "volcano")

#: (apiVersion, kind) -> schema file.
SCHEMA_FILES = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_v1alpha2_jobset.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_v1alpha1_trainjob.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer.kubeflow.org_v1alpha1_trainingruntime.json",
    ("batch.volcano.sh/v1alpha1", "Job"): "batch.volcano.sh_v1alpha1_job.json",
}


def strict(schema):
    """``schema`` with unknown fields refused wherever it lists the fields (the API server's strict validation)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validators() -> dict:
    return {key: jsonschema.Draft7Validator(strict(json.loads((SCHEMAS / f).read_text())))
            for key, f in SCHEMA_FILES.items()}


@pytest.fixture(scope="module")
def spec_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("forms")
    files = {}
    for strategy, spec in SPECS.items():
        files[strategy] = folder / f"{strategy}.yaml"
        files[strategy].write_text(yaml.safe_dump(spec))
    return files


@pytest.fixture(scope="module")
def emitted(spec_files) -> dict[tuple[str, str], list[dict]]:
    """The CLI's documents for every form and strategy (the processes run side by side)."""
    runs = {
        (form, strategy): start_cli(
            "tfdist.manifest", "--cluster", str(spec_files[strategy]), "--form", form,
            "--image", "registry.example.com/tfdist:0.1", "--name", NAME, "--namespace", "ml", "--gpus", "1",
            "--volume", "unet-runs", "--strategy", strategy, "--", "--epochs", "2",
            "--global_batch_size", "24")
        for form in FORMS for strategy in SPECS
    }
    documents = {}
    for key, proc in runs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        documents[key] = list(yaml.safe_load_all(out))
    return documents


def leader_port(spec: dict) -> int:
    leader = spec.get("chief") or spec["worker"]
    return int((leader if isinstance(leader, str) else leader[0]).rpartition(":")[2])


def counts(spec: dict) -> dict[str, int]:
    return {t: 1 if isinstance(a, str) else len(a) for t, a in spec.items()}


def controller_cluster(form: str, spec: dict) -> dict[str, list[str]]:
    """The cluster the controller's naming gives (JobSet: <js>-<rjob>-<job>-<pod>.<subdomain>; Volcano: svc plugin)."""
    middle = "" if form == "volcano" else "-0"
    port = leader_port(spec)
    return {t: [f"{NAME}-{t}{middle}-{i}.{NAME}:{port}" for i in range(n)] for t, n in counts(spec).items()}


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> dict[tuple[str, str], dict[tuple[str, int], dict]]:
    """``tfdist.tfconfig --task`` for every task of every controller's cluster.

    One process per task of each distinct cluster (JobSet and Trainer name
    pods alike, and three strategies share one cluster), all side by side.
    """
    folder = tmp_path_factory.mktemp("expected")
    clusters = {(form, strategy): controller_cluster(form, spec) for form in FORMS for strategy, spec in SPECS.items()}
    runs = {}
    for n, text in enumerate(sorted({json.dumps(c, sort_keys=True) for c in clusters.values()})):
        path = folder / f"cluster{n}.yaml"
        path.write_text(yaml.safe_dump(json.loads(text)))
        for task_type, addresses in json.loads(text).items():
            for i in range(len(addresses)):
                runs[(text, task_type, i)] = start_cli("tfdist.tfconfig", "--cluster", str(path), "--task",
                                                       f"{task_type}:{i}")
    printed: dict = {}
    for (text, task_type, i), proc in runs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        printed.setdefault(text, {})[(task_type, i)] = json.loads(out)
    return {key: printed[json.dumps(c, sort_keys=True)] for key, c in clusters.items()}


def container_env(container: dict, labels: dict[str, str]) -> dict[str, str]:
    """A container's variables as the kubelet sets them: literal values, and pod labels by the downward API."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path.startswith("metadata.labels['") and path.endswith("']"), path
            env[var["name"]] = labels[path[len("metadata.labels['"):-2]]
    return env


def entrypoint_task(container: dict, env: dict[str, str]):
    """The task the container's own command resolves (``tfdist.train``'s ``--cluster``, from its arguments)."""
    args = container["args"]
    cluster_flag = args[args.index("--cluster") + 1] if "--cluster" in args else None
    return sources.resolve_task(cluster_flag, None, environ=env)


def jobset_pods(jobset_name: str, jobset_spec: dict):
    """Every pod JobSet and the Job controller make: (task type, index, container, environment)."""
    for rjob in jobset_spec["replicatedJobs"]:
        assert rjob["replicas"] == 1
        job = rjob["template"]["spec"]
        assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"]
        labels = {"jobset.sigs.k8s.io/jobset-name": jobset_name, "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                  "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/replicatedjob-replicas": "1"}
        (container,) = job["template"]["spec"]["containers"]
        for i in range(job["completions"]):
            env = {**container_env(container, labels), "JOB_COMPLETION_INDEX": str(i),
                   "HOSTNAME": f"{jobset_name}-{rjob['name']}-0-{i}"}
            yield rjob["name"], i, container, env


def volcano_pods(job: dict):
    """Every pod of a Volcano Job with the TF_CONFIG its ``tensorflow`` plugin writes (generateTFClusterSpec)."""
    name, spec = job["metadata"]["name"], job["spec"]
    (port_arg,) = spec["plugins"]["tensorflow"]
    port = int(port_arg.removeprefix("--port="))
    cluster = {t["name"]: [f"{name}-{t['name']}-{i}.{name}:{port}" for i in range(t["replicas"])] for t in spec["tasks"]}
    single = len(spec["tasks"]) == 1 and spec["tasks"][0]["replicas"] == 1  # the plugin writes nothing then
    for task in spec["tasks"]:
        (container,) = task["template"]["spec"]["containers"]
        for i in range(task["replicas"]):
            env = {**container_env(container, {}), "HOSTNAME": f"{name}-{task['name']}-{i}"}
            if not single:
                env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": task["name"], "index": i}})
            yield task["name"], i, container, env


def pods(form: str, documents: list[dict]):
    if form == "jobset":
        (jobset,) = documents
        return jobset_pods(jobset["metadata"]["name"], jobset["spec"])
    if form == "trainjob":
        runtime, trainjob = documents
        assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
        return jobset_pods(trainjob["metadata"]["name"], runtime["spec"]["template"]["spec"])  # Trainer names it so
    (job,) = documents
    return volcano_pods(job)


@pytest.mark.parametrize("strategy", SPECS)
@pytest.mark.parametrize("form", FORMS)
def test_manifests_validate_against_the_published_schema(emitted, validators, form, strategy):
    for document in emitted[(form, strategy)]:
        validator = validators[(document["apiVersion"], document["kind"])]
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
        assert not errors, errors


def test_the_strict_schema_refuses_a_misspelled_field(emitted, validators):
    (document,) = emitted[("jobset", "parameter_server")]
    document = json.loads(json.dumps(document))
    document["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["imag"] = "x"
    assert not validators[("jobset.x-k8s.io/v1alpha2", "JobSet")].is_valid(document)


def pod_templates(form: str, documents: list[dict]) -> list[dict]:
    if form == "volcano":
        return [t["template"] for t in documents[0]["spec"]["tasks"]]
    jobset_spec = documents[0]["spec"] if form == "jobset" else documents[0]["spec"]["template"]["spec"]
    return [r["template"]["spec"]["template"] for r in jobset_spec["replicatedJobs"]]


@pytest.mark.parametrize("form", FORMS)
def test_pod_templates_read_back_with_the_client_models(emitted, form):
    client = kubernetes.client.ApiClient()
    for template in pod_templates(form, emitted[(form, "parameter_server")]):
        model = client._ApiClient__deserialize(template, "V1PodTemplateSpec")
        assert client.sanitize_for_serialization(model) == template


@pytest.mark.parametrize("strategy", SPECS)
@pytest.mark.parametrize("form", FORMS)
def test_every_pod_computes_the_tf_config_of_its_task(emitted, expected, form, strategy):
    seen = set()
    for task_type, index, container, env in pods(form, emitted[(form, strategy)]):
        task = entrypoint_task(container, env)
        want = expected[(form, strategy)][(task_type, index)]
        if form == "volcano" and len(want["cluster"]) == 1 and len(next(iter(want["cluster"].values()))) == 1:
            assert task is None  # Volcano's plugin leaves a one-task Job without TF_CONFIG: one process
        else:
            assert json.loads(task.tf_config_json()) == want
        assert container["args"][:2] == ["--strategy", strategy]
        seen.add((task_type, index))
    assert seen == set(expected[(form, strategy)])


@pytest.mark.parametrize("form", FORMS)
def test_every_form_carries_the_grace_period_the_command_and_the_volume(emitted, form):
    documents = emitted[(form, "parameter_server")]
    for template in pod_templates(form, documents):
        assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == NAME  # kubectl logs -l selects them
        pod = template["spec"]
        assert pod["terminationGracePeriodSeconds"] >= 60
        (container,) = pod["containers"]
        assert container["command"] == ["python", "-m", "tfdist.train"]
        assert container["args"][container["args"].index("--model_dir") + 1] == f"/runs/{NAME}"
        if form != "volcano":
            assert pod["volumes"] == [{"name": "model-dir", "persistentVolumeClaim": {"claimName": "unet-runs"}}]
            assert container["volumeMounts"] == [{"name": "model-dir", "mountPath": "/runs"}]
    if form == "volcano":
        assert documents[0]["spec"]["volumes"] == [{"mountPath": "/runs", "volumeClaimName": "unet-runs"}]


@pytest.mark.parametrize("form", FORMS)
def test_doctor_manifests_run_the_doctor_in_the_same_pods(spec_files, validators, expected, form):
    proc = run_cli("tfdist.manifest", "--cluster", str(spec_files["parameter_server"]), "--form", form, "--image",
                   "img:1", "--name", NAME, "--volume", "unet-runs", "--doctor", "--", "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    documents = list(yaml.safe_load_all(proc.stdout))
    for document in documents:
        assert validators[(document["apiVersion"], document["kind"])].is_valid(document)
    for task_type, index, container, env in pods(form, documents):
        assert container["command"] == ["python", "-m", "tfdist.doctor"]
        assert "--epochs" not in container["args"] and f"/runs/{NAME}" in container["args"]
        want = expected[(form, "parameter_server")][(task_type, index)]
        assert json.loads(entrypoint_task(container, env).tf_config_json()) == want


def job_failure_message(exit_code: int | None) -> str:
    """The Job controller's message for a pod that matched a FailJob rule (pkg/controller/job/pod_failure_policy.go)."""
    if exit_code is None:
        return "Pod ml/unet-worker-0-1-abcde has condition DisruptionTarget matching FailJob rule at index 2"
    return (f"Container tensorflow for pod ml/unet-worker-0-1-abcde failed with exit code {exit_code} "
            f"matching FailJob rule at index 0")


def jobset_action(failure_policy: dict, message: str) -> str:
    """JobSet's verdict: the first rule whose reason and a pattern match, else RestartJobSet."""
    import re
    for rule in failure_policy["rules"]:
        if "PodFailurePolicy" in rule["onJobFailureReasons"] and any(
                re.search(p, message) for p in rule["onJobFailureMessagePatterns"]):
            return rule["action"]
    return "RestartJobSet"


@pytest.mark.parametrize("form", ("jobset", "trainjob"))
def test_jobset_policies_fail_on_2_and_3_restart_on_42_and_evictions_and_end_with_the_leader(emitted, form):
    documents = emitted[(form, "parameter_server")]
    jobset_spec = documents[0]["spec"] if form == "jobset" else documents[0]["spec"]["template"]["spec"]
    policy = jobset_spec["failurePolicy"]
    assert 0 < policy["maxRestarts"] <= 10
    verdicts = {code: jobset_action(policy, job_failure_message(code)) for code in (2, 3, 42, 4, None)}
    assert verdicts == {2: "FailJobSet", 3: "FailJobSet", 42: "RestartJobSet", 4: "RestartJobSet",
                        None: "RestartJobSet"}
    assert jobset_action(policy, job_failure_message(12)) == "RestartJobSet"  # 2 only as a whole code
    assert jobset_spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    for rjob in jobset_spec["replicatedJobs"]:
        job = rjob["template"]["spec"]
        container = job["template"]["spec"]["containers"][0]["name"]
        assert job["backoffLimit"] == 0
        rules = job["podFailurePolicy"]["rules"]
        assert all(r["onExitCodes"]["containerName"] == container for r in rules if "onExitCodes" in r)
        # A preempted or evicted pod fails its Job too (a plain Job would start a new pod): the JobSet restarts
        # every Job together on the message, which names the exit code or the condition.
        by_code = {code: next(r["action"] for r in rules if code in r.get("onExitCodes", {}).get("values", ()))
                   for code in (2, 3, 42)}
        evicted = next(r["action"] for r in rules
                       if any(c["type"] == "DisruptionTarget" for c in r.get("onPodConditions", ())))
        assert by_code == {2: "FailJob", 3: "FailJob", 42: "FailJob"} and evicted == "FailJob"


def test_trainjob_marks_the_workers_as_trainers_nodes(emitted):
    runtime, _ = emitted[("trainjob", "parameter_server")]
    jobs = {r["name"]: r["template"] for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    assert jobs["worker"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert jobs["worker"]["spec"]["template"]["spec"]["containers"][0]["name"] == "node"
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2}
    assert "metadata" not in jobs["chief"] and "metadata" not in jobs["ps"]


def test_volcano_gang_and_policies(emitted):
    (job,) = emitted[("volcano", "multi_worker_mirrored")]
    spec = job["spec"]
    assert spec["minAvailable"] == 4 and spec["schedulerName"] == "volcano"
    assert {(p.get("event"), p.get("exitCode")): p["action"] for p in spec["policies"]} == {
        ("PodEvicted", None): "RestartJob", (None, 42): "RestartJob", (None, 2): "TerminateJob",
        (None, 3): "TerminateJob"}
    tasks = {t["name"]: t for t in spec["tasks"]}
    assert tasks["chief"]["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert "policies" not in tasks["worker"]
    assert spec["plugins"]["tensorflow"] == ["--port=3333"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("args, match", [
    ((), "Missing `--volume`"),
    (("--volume", "Bad_Claim"), "Invalid value for `--volume`"),
    (("--volume", "runs", "--", "--model_dir", "/data/unet"), "Invalid value for `--model_dir` with --volume"),
    (("--volume", "runs", "--name", "a" * 56), "Invalid value for `--name`"),
])
def test_bad_manifest_inputs_are_one_line_and_status_2(spec_files, form, args, match):
    flags, _, extra = " ".join(args).partition("-- ")
    proc = run_cli("tfdist.manifest", "--cluster", str(spec_files["parameter_server"]), "--form", form, "--image",
                   "img:1", *flags.split(), *(["--", *extra.split()] if extra else []))
    assert_user_error(proc, re.escape(match))


def test_jobset_host_names_have_the_job_index_in_their_length(spec_files):
    """``<name>-worker-0-1`` is 2 characters longer than Volcano's ``<name>-worker-1``: a 53-character name fits one."""
    common = ("--cluster", str(spec_files["parameter_server"]), "--image", "img:1", "--volume", "runs", "--name", "a" * 53)
    assert run_cli("tfdist.manifest", *common, "--form", "volcano").returncode == 0
    for form in ("jobset", "trainjob"):
        proc = run_cli("tfdist.manifest", *common, "--form", form)
        assert_user_error(proc, re.escape("'" + "a" * 53 + "-worker-0-0' is 64 characters"))


@pytest.mark.parametrize("flag", (("--volume", "runs"), ("--doctor",)))
def test_volume_and_doctor_with_a_form_that_takes_neither_are_refused(spec_files, flag):
    proc = run_cli("tfdist.manifest", "--cluster", str(spec_files["parameter_server"]), "--form", "kubernetes",
                   "--image", "img:1", *flag)
    assert_user_error(proc, re.escape(f"Unexpected `{flag[0]}`"))


def test_the_train_config_takes_the_pods_cluster_without_a_task():
    from tfdist.segmentation import config
    assert config.build_config(overrides={"cluster": "kubernetes"}).runtime.cluster == "kubernetes"
    with pytest.raises(UserError, match="Unexpected `--task` with --cluster=kubernetes"):
        config.build_config(overrides={"cluster": "kubernetes", "task": "worker:0"})


#: A worker pod of a JobSet of a chief and 2 workers, as the controllers set it up.
POD = {"TFDIST_TASKS": '{"chief": 1, "worker": 2}', "TFDIST_PORT": "2222", "TFDIST_SUBDOMAIN": "unet",
       "TFDIST_TASK_TYPE": "worker", "TFDIST_JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "1",
       "HOSTNAME": "unet-worker-0-1"}


def test_a_pod_is_found_without_flags_and_a_plain_indexed_job_too():
    task = sources.resolve_task(None, None, environ=POD)
    assert (task.type, task.index, task.address) == ("worker", 1, "unet-worker-0-1.unet:2222")
    plain = {**{k: v for k, v in POD.items() if k not in ("TFDIST_JOB_INDEX", "TFDIST_SUBDOMAIN")},
             "HOSTNAME": "unet-worker-1"}
    assert pod_source.resolve(plain).spec.as_dict() == {"chief": ["unet-chief-0.unet:2222"],
                                                       "worker": ["unet-worker-0.unet:2222", "unet-worker-1.unet:2222"]}


@pytest.mark.parametrize("change, match", [
    ({"JOB_COMPLETION_INDEX": None}, "JOB_COMPLETION_INDEX is not set .is the pod's Job an Indexed Job"),
    ({"JOB_COMPLETION_INDEX": "2"}, "out of range"),
    ({"JOB_COMPLETION_INDEX": "x"}, "not a non-negative integer"),
    ({"TFDIST_TASK_TYPE": "ps"}, "not a task type of TFDIST_TASKS"),
    ({"TFDIST_TASKS": '{"chief": 1, "worker": 0}'}, "not a mapping of task type to count"),
    ({"TFDIST_TASKS": "chief=1"}, "not JSON"),
    ({"TFDIST_TASKS": '{"chief": 2, "worker": 2}'}, "Too many `chief` tasks in the pod's environment"),
    ({"TFDIST_TASKS": '{"chief": 1, "worker": 2, "worker": 3}'}, "the task type 'worker' is given twice"),
    ({"TFDIST_TASKS": '{"chief": 1, "worker": 100000000000000000000}'}, "more than 65536 tasks"),
    ({"JOB_COMPLETION_INDEX": "\u00b9"}, "not a non-negative integer"),
    ({"TFDIST_PORT": "70000"}, "not a port"),
    ({"TFDIST_JOB_INDEX": "1"}, "more than one Job"),
    ({"HOSTNAME": "unet-worker-0-0"}, "not the host name of worker:1"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'}, "Ambiguous task"),
])
def test_a_pod_whose_environment_does_not_add_up_is_a_user_error(change, match):
    env = {k: v for k, v in {**POD, **change}.items() if v is not None}
    with pytest.raises(UserError, match=match):
        sources.resolve_task(None, None, environ=env)


def test_the_cli_prints_a_pods_tf_config_and_refuses_a_bad_one_in_one_line():
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    ok = run_cli("tfdist.tfconfig", "--cluster", "kubernetes", env={**base, **POD}, inherit=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["task"] == {"type": "worker", "index": 1}
    bad = run_cli("tfdist.tfconfig", "--cluster", "kubernetes", env={**base, **POD, "JOB_COMPLETION_INDEX": "7"},
                  inherit=False)
    assert_user_error(bad, "out of range")
    flags = run_cli("tfdist.tfconfig", "--cluster", "kubernetes", "--task", "worker:0", env={**base, **POD},
                    inherit=False)
    assert_user_error(flags, re.escape("Unexpected `--task` with --cluster=kubernetes"))
