"""Kubernetes manifests for a cluster spec: a headless Service and a Job per task, or a Kubeflow TFJob."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import yaml

from tfdist import cluster, strategies
from tfdist.errors import PERMANENT_EXIT_CODES, PREEMPTED_EXIT_CODE, UserError

#: The ``tfdist.manifest --form`` values of the plain (Jobs and a Service) and legacy (TFJob) forms.
EMITS = ("kubernetes", "tfjob")

#: The container name (the training operator requires "tensorflow" for a TFJob).
CONTAINER = "tensorflow"

#: The port name the training operator reads for TF_CONFIG.
TFJOB_PORT_NAME = "tfjob-port"

#: Pods a task's Job may start before it fails (evictions and preemptions not counted).
BACKOFF_LIMIT = 3

#: Seconds from SIGTERM to SIGKILL for a pod stopped (evicted, preempted, deleted): a training task's time to
#: save the step reached and exit 42. Kubernetes' 30 s is short to finish a step and write a model to shared storage.
TERMINATION_GRACE_SECONDS = 90

#: The TFJob container's first process: it runs ``TRAIN_COMMAND``, passes the kubelet's signals on and makes
#: exit 42 a status the operator retries (``tfjob_entry``).
TFJOB_ENTRY = ("python", "-m", "tfdist.deploy.tfjob_entry")

TRAIN_COMMAND = ("python", "-m", "tfdist.train")  #: every task's command (its arguments: the container's ``args``)

#: Default resources of every task.
DEFAULT_CPU = "2"
DEFAULT_MEMORY = "4Gi"
DEFAULT_GPUS = 0

#: The resource name of NVIDIA GPUs (the device plugin's).
GPU_RESOURCE = "nvidia.com/gpu"

#: TF_CONFIG task type -> TFJob replica type.
TFJOB_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}

_DNS_LABEL_MAX = 63
_DNS_1035_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# A Kubernetes quantity as users write one: 2, 0.5, 500m, 4Gi, 1e3.
#: A container image reference as registries take it (distribution/reference's grammar): an optional registry
#: host, lowercase path components, then an optional tag and digest.
_IMAGE_DOMAIN_RE = re.compile(r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
                              r"(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?")
_IMAGE_TAG_RE = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_IMAGE_PATH_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-*)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-*)[a-z0-9]+)*)*"
                            r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:"
                            r"[0-9a-fA-F]{32,})?", re.ASCII)


def image_problem(image: str) -> str | None:
    """Why no registry would take ``image`` as a reference (None: it is one), for ``--image``'s one line."""
    if not image or any(c.isspace() for c in image):
        return "empty or with spaces"
    if "://" in image:
        return "a URL, not an image reference (no scheme)"
    first, slash, rest = image.partition("/")
    # As distribution/reference: the first component is a registry host if it has '.' or ':', is localhost,
    # or has capitals; otherwise it is part of the repository's path.
    has_domain = slash and (any(c in first for c in ".:") or first == "localhost" or first.lower() != first)
    path = rest if has_domain else image
    if has_domain and not _IMAGE_DOMAIN_RE.fullmatch(first):
        return f"the registry host {first!r} is not a host[:port]"
    if has_domain and ":" in first and not 0 < int(first.rpartition(":")[2]) <= 65535:
        return f"the registry port of {first!r} is not a port (1 to 65535)"
    if not _IMAGE_PATH_RE.fullmatch(path):
        name = path.split("@")[0].rsplit(":", 1)
        if len(name) == 2 and "/" not in name[1] and not name[1]:
            return "its tag is empty"
        if len(name) == 2 and "/" not in name[1] and not _IMAGE_TAG_RE.fullmatch(name[1]):
            return (f"its tag {name[1]!r} is not ASCII letters, digits, '_', '.' and '-' (at most 128, first not "
                    "'.' or '-')")
        return "the repository must be lowercase letters, digits and . _ - / separators, then :tag and @digest"
    return None


_QUANTITY_RE = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


def _label_error(flag: str, value: str, problem: str, expected: str) -> UserError:
    """The one-line error of a bad ``--flag`` value."""
    return UserError(f"Invalid value for `--{flag}`: {problem}. Received: {flag}={value!r}. Expected {expected}.")


def check_name(name: str, spec: cluster.ClusterSpec) -> None:
    """Check ``--name``: the Service, the TFJob and the prefix of every task's host name.

    It must be a DNS-1035 label (a Service name: lowercase letters, digits and
    '-', starting with a letter), short enough that the longest task host
    name, ``<name>-<type>-<i>``, is still a 63-character DNS label (a pod's
    ``hostname``).

    Raises:
        UserError: ``name`` is not such a label, or too long for ``spec``.
    """
    expected = "a DNS-1035 label: lowercase letters, digits and '-', starting with a letter, e.g. tfdist-unet"
    if not _DNS_1035_RE.fullmatch(name or ""):
        raise _label_error("name", name, "not a DNS-1035 label", expected)
    longest = max((task_hostname(name, t, i) for t, i in spec.task_list()), key=len)
    if len(longest) > _DNS_LABEL_MAX:
        raise _label_error(
            "name", name, f"the task host name {longest!r} is {len(longest)} characters",
            f"a name short enough for host names of at most {_DNS_LABEL_MAX} characters",
        )


def check_namespace(namespace: str) -> None:
    """Check ``--namespace`` (empty: none, kubectl's current one): a DNS-1123 label.

    Raises:
        UserError: ``namespace`` is not empty and not such a label.
    """
    if namespace and not (_DNS_1123_RE.fullmatch(namespace) and len(namespace) <= _DNS_LABEL_MAX):
        raise _label_error(
            "namespace", namespace, "not a DNS-1123 label",
            f"lowercase letters, digits and '-', at most {_DNS_LABEL_MAX} characters, e.g. ml-team",
        )


def check_resources(cpu: str, memory: str, gpus: int) -> None:
    """Check ``--cpu``, ``--memory`` (Kubernetes quantities, e.g. 500m, 4Gi) and ``--gpus``.

    Raises:
        UserError: a quantity is malformed or zero, or ``gpus`` is negative or past int64 (a Kubernetes quantity's
            range).
    """
    for flag, value, example in (("cpu", cpu, "2 or 500m"), ("memory", memory, "4Gi or 512Mi")):
        found = _QUANTITY_RE.fullmatch(value or "")
        if not found:
            raise _label_error(flag, value, "not a Kubernetes quantity", f"a quantity such as {example}")
        if float(found.group(1)) == 0:
            raise _label_error(flag, value, "zero, which leaves a task nothing to train with",
                               f"a quantity above 0, such as {example}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus < 2**63:
        raise _label_error("gpus", str(gpus), "not a count", "an integer >= 0 and below 2**63")


def task_hostname(name: str, task_type: str, index: int) -> str:
    """The host name (pod ``hostname``, Job name) of one task: ``<name>-<type>-<i>``."""
    return f"{name}-{task_type}-{index}"


def dns_spec(spec: cluster.ClusterSpec, name: str) -> cluster.ClusterSpec:
    """``spec`` with every host replaced by its stable DNS name ``<name>-<type>-<i>.<name>``; ports kept.

    This is the cluster every task's TF_CONFIG names on Kubernetes.
    """
    renamed = {
        task_type: [
            f"{task_hostname(name, task_type, i)}.{name}:{cluster.split_address(address)[1]}"
            for i, address in enumerate(addresses)
        ]
        for task_type, addresses in spec.tasks.items()
    }
    return cluster.parse_cluster_spec(renamed, source=spec.source)


def object_metadata(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """An object's metadata; no namespace key when none is given, so that kubectl's applies."""
    return {"name": name, **({"namespace": namespace} if namespace else {}), "labels": labels}


def run_labels(name: str) -> dict[str, str]:
    """The labels of every object of a run; the Service selects its pods by them."""
    return {"app.kubernetes.io/name": "tfdist", "app.kubernetes.io/instance": name}


def _task_labels(name: str, task_type: str, index: int) -> dict[str, str]:
    """The run's labels plus the task's type and index, to select one task's Job or pod."""
    return {**run_labels(name), "tfdist/task-type": task_type, "tfdist/task-index": str(index)}


@dataclasses.dataclass(frozen=True)
class Deployment:
    """How every task of a run is deployed: the image, the train command and the resources.

    Attributes:
        image: the container image, with tfdist installed.
        strategy: ``--strategy`` of every task; empty: ``default_strategy``.
        train_args: more ``tfdist.train`` arguments for every task.
        name: the Service (or TFJob) name and the prefix of every task's name.
        namespace: the namespace of every object; empty: none written (kubectl's).
        cpu, memory: what each task requests (memory is also its limit).
        gpus: GPUs of each task but ps.
    """

    image: str
    strategy: str = ""
    train_args: tuple[str, ...] = ()
    name: str = "tfdist"
    namespace: str = ""
    cpu: str = DEFAULT_CPU
    memory: str = DEFAULT_MEMORY
    gpus: int = DEFAULT_GPUS

    def strategy_for(self, spec: cluster.ClusterSpec) -> str:
        """``strategy``, or the default for ``spec`` when it is empty."""
        return self.strategy or default_strategy(spec)

    def check(self, spec: cluster.ClusterSpec) -> None:
        """Check every field against ``spec`` before anything is built.

        Raises:
            UserError: a bad ``image``, ``name``, ``namespace`` or resource, or
                a strategy that does not fit ``spec``.
        """
        problem = image_problem(self.image)
        if problem:
            raise UserError(
                f"Invalid value for `--image`: {problem}. Received: image={self.image!r}. "
                f"Expected a container image with tfdist installed, e.g. registry.example.com/tfdist:0.1.0."
            )
        check_name(self.name, spec)
        check_namespace(self.namespace)
        check_resources(self.cpu, self.memory, self.gpus)
        strategies.check_strategy(spec, self.strategy_for(spec))

    def container(
        self, spec: cluster.ClusterSpec, task_type: str, port: int, port_name: str, env: Sequence[dict[str, str]] = (),
        command: Sequence[str] = TRAIN_COMMAND,
    ) -> dict[str, Any]:
        """The one container of a task of ``task_type``: ``command`` (the train CLI), its port and its resources."""
        limits = {"memory": self.memory}
        if self.gpus and task_type != "ps":  # ps tasks only hold variables
            limits[GPU_RESOURCE] = str(self.gpus)
        container = {
            "name": CONTAINER,
            "image": self.image,
            "command": list(command),
            "args": ["--strategy", self.strategy_for(spec), *self.train_args],
            "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": self.cpu, "memory": self.memory}, "limits": limits},
        }
        if env:
            container["env"] = list(env)
        return container


def default_strategy(spec: cluster.ClusterSpec) -> str:
    """The strategy of a cluster when ``--strategy`` is not given: ``auto``'s for that cluster
    (``strategies.auto_strategy``)."""
    return strategies.auto_strategy(frozenset(spec.tasks), local_devices=1)


#: What a Job does with a pod that exited 42 (preempted: a checkpoint was saved) or was evicted, by who restarts
#: the run (``pod_failure_rules``): the Job itself, with a new pod for that task, or the JobSet over the Job.
PREEMPTED_ACTIONS = {"restart_pod": "Ignore", "fail_job": "FailJob"}


def pod_failure_rules(container: str = CONTAINER, *, preempted: str = "restart_pod") -> list[dict[str, Any]]:
    """A Job's ``podFailurePolicy`` rules (Kubernetes >= 1.26); the first that matches a failed pod decides.

    Exit 2 or 3 fails the Job at once (a user error or a diverged loss would end a new pod the same way). A pod
    that exited 42 (preempted: a checkpoint was saved) or was evicted (``DisruptionTarget``) is no fault of the
    run, and what its Job does with it depends on who restarts the run (``PREEMPTED_ACTIONS``):

    - ``"restart_pod"``: a plain Job per task (``manifests``) restarts its own task: ``Ignore`` starts a new pod,
      not counted against ``backoffLimit`` as any other failure is.
    - ``"fail_job"``: a JobSet's Job (the gang-admitted forms) fails at once too, its message naming the exit
      code or the condition, so that the JobSet's ``failurePolicy`` (``common.failure_policy``) tells a
      preemption from a user error and restarts every Job together, as the gang was admitted.

    ``container``: the container whose exit code counts. Exit codes ascending, as the API server wants.
    """
    action = PREEMPTED_ACTIONS[preempted]
    exits = {"containerName": container, "operator": "In"}
    return [
        {"action": "FailJob", "onExitCodes": {**exits, "values": sorted(PERMANENT_EXIT_CODES)}},
        {"action": action, "onExitCodes": {**exits, "values": [PREEMPTED_EXIT_CODE]}},
        {"action": action, "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]


def manifests(spec: cluster.ClusterSpec, deployment: Deployment) -> list[dict[str, Any]]:
    """A headless Service and one Job per task, each with the TF_CONFIG of ``dns_spec(spec, name)``.

    Args:
        spec: the cluster: its task types, counts and ports (its hosts are
            replaced by DNS names).
        deployment: the image, train command and resources of every task.

    Returns:
        The Service, then the Jobs in ``spec.task_list()`` order.

    Raises:
        UserError: ``deployment.check`` fails.
    """
    deployment.check(spec)
    name, namespace = deployment.name, deployment.namespace
    renamed = dns_spec(spec, name)
    ports = sorted({cluster.split_address(a)[1] for a in renamed.addresses()})
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(name, namespace, run_labels(name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": run_labels(name),
            "ports": [{"name": f"grpc-{p}", "port": p, "targetPort": p, "protocol": "TCP"} for p in ports],
        },
    }
    jobs = []
    for task_type, index in renamed.task_list():
        hostname = task_hostname(name, task_type, index)
        labels = _task_labels(name, task_type, index)
        tf_config = cluster.Task(spec=renamed, type=task_type, index=index).tf_config_json()
        container = deployment.container(
            spec, task_type, cluster.split_address(renamed.address(task_type, index))[1], "grpc",
            env=[{"name": "TF_CONFIG", "value": tf_config}],
        )
        jobs.append({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": object_metadata(hostname, namespace, labels),
            "spec": {
                "backoffLimit": BACKOFF_LIMIT,
                "podFailurePolicy": {"rules": pod_failure_rules()},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "hostname": hostname,
                        "subdomain": name,
                        "restartPolicy": "Never",  # podFailurePolicy requires it
                        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                        "containers": [container],
                    },
                },
            },
        })
    return [service, *jobs]


def tfjob(spec: cluster.ClusterSpec, deployment: Deployment) -> dict[str, Any]:
    """A Kubeflow ``TFJob`` (``kubeflow.org/v1``) with ``spec``'s task types and counts.

    Each replica type's port is the port of its first task in ``spec``; the
    hosts of ``spec`` are not used (the operator names the pods and writes
    TF_CONFIG).

    Raises:
        UserError: ``deployment.check`` fails.
    """
    deployment.check(spec)
    replica_specs = {}
    for task_type, addresses in spec.tasks.items():
        container = deployment.container(
            spec, task_type, cluster.split_address(addresses[0])[1], TFJOB_PORT_NAME,
            command=(*TFJOB_ENTRY, *TRAIN_COMMAND),  # 42 -> a status the operator retries
        )
        replica_specs[TFJOB_REPLICA_TYPES[task_type]] = {
            "replicas": len(addresses),
            "restartPolicy": "ExitCode",  # the operator sets the pods' own restartPolicy to Never
            "template": {
                "metadata": {"labels": run_labels(deployment.name)},
                "spec": {"terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS, "containers": [container]},
            },
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": object_metadata(deployment.name, deployment.namespace, run_labels(deployment.name)),
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": BACKOFF_LIMIT},
            "tfReplicaSpecs": replica_specs,
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """A safe YAML dumper: a value used twice (e.g. labels) written twice, not as an anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        """Never alias: manifests stay readable and each document stands alone."""
        return True

    def represent_str(self, data: str) -> yaml.ScalarNode:
        """Text of several lines (a script) as a literal block (``|``), as it reads as code."""
        return self.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_PlainDumper.add_representer(str, _PlainDumper.represent_str)


def to_yaml(documents: Sequence[dict[str, Any]]) -> str:
    """The manifests as one multi-document YAML stream, in order, for ``kubectl apply -f``."""
    return yaml.dump_all(list(documents), Dumper=_PlainDumper, sort_keys=False, explicit_start=True)
