"""What every gang-admitted form shares: the run's storage, the pod's variables, the restart rules, one JobSet."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Sequence

from tfdist import cluster
from tfdist.deploy import kubernetes
from tfdist.cluster import kubernetes as pod_source
from tfdist.cluster.spec import KUBERNETES
from tfdist.errors import PERMANENT_EXIT_CODES, PREEMPTED_EXIT_CODE, UserError

#: Where ``--volume`` is mounted in every pod; ``--model_dir`` must lie under it.
MODEL_MOUNT = "/runs"

#: The pod volume that holds ``--volume``.
VOLUME = "model-dir"

#: What every pod runs with ``--doctor``: the doctor's check of the same pods (they meet as training would).
DOCTOR_COMMAND = ("python", "-m", "tfdist.doctor")

#: How many times a run is restarted whole (after a preemption, an eviction or a crash) before it fails.
MAX_RESTARTS = 5

#: The JobSet labels that the downward API turns into the pod's task type and job index.
JOBSET_TYPE_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"

#: A DNS-1123 subdomain: DNS labels (lowercase letters, digits and '-', a letter or digit at both ends) joined by '.'.
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_volume(volume: str) -> None:
    """Check ``--volume``: the name of a PersistentVolumeClaim (a DNS-1123 subdomain) every pod mounts.

    Raises:
        UserError: ``volume`` is empty or not such a name.
    """
    if not (volume and len(volume) <= 253 and _DNS_1123_SUBDOMAIN.fullmatch(volume)):
        raise UserError(
            f"Invalid value for `--volume`. Received: volume={volume!r}. Expected the name of a PersistentVolumeClaim "
            f"(ReadWriteMany, shared by every pod) that holds --model_dir, e.g. --volume unet-runs."
        )


def model_dir_args(train_args: Sequence[str], name: str) -> tuple[tuple[str, ...], str]:
    """``train_args`` with a ``--model_dir`` under ``MODEL_MOUNT`` (the one given, or ``MODEL_MOUNT/<name>``), and it.

    Given more than once, the last ``--model_dir`` is the one (as absl reads a flag given twice).

    Raises:
        UserError: the ``--model_dir`` given is not under ``MODEL_MOUNT``.
    """
    args = list(train_args)
    given = None
    for i, arg in enumerate(args):
        if arg in ("--model_dir", "-model_dir") and i + 1 < len(args):
            given = args[i + 1]
        elif arg.startswith(("--model_dir=", "-model_dir=")):
            given = arg.partition("=")[2]
    if given is None:
        return (*args, "--model_dir", f"{MODEL_MOUNT}/{name}"), f"{MODEL_MOUNT}/{name}"
    if not given.startswith(MODEL_MOUNT + "/") or ".." in given.split("/"):
        raise UserError(
            f"Invalid value for `--model_dir` with --volume. Received: model_dir={given!r}. "
            f"Expected a directory under {MODEL_MOUNT}/, where --volume is mounted in every pod, "
            f"e.g. {MODEL_MOUNT}/{name}."
        )
    return tuple(args), given


def run_port(spec: cluster.ClusterSpec) -> int:
    """The one port of every task on Kubernetes: the port of ``spec``'s leader."""
    return cluster.split_address(spec.address(*spec.leader()))[1]


def jobset_hosts(spec: cluster.ClusterSpec, name: str, subdomain: str) -> dict[str, list[str]]:
    """Every task's ``host:port`` in a JobSet named ``name``: ``<name>-<type>-0-<i>.<subdomain>:<port>``."""
    port = run_port(spec)
    return {t: [f"{name}-{t}-0-{i}.{subdomain}:{port}" for i in range(spec.count(t))] for t in spec.tasks}


def check_host_names(spec: cluster.ClusterSpec, name: str) -> None:
    """Check that the longest pod host name of a JobSet named ``name``, ``<name>-<type>-0-<i>``, is a DNS label.

    Raises:
        UserError: it is longer than 63 characters.
    """
    longest = max((h.partition(".")[0] for hosts in jobset_hosts(spec, name, name).values() for h in hosts), key=len)
    if len(longest) > 63:
        raise UserError(
            f"Invalid value for `--name`: the pod host name {longest!r} is {len(longest)} characters. "
            f"Received: name={name!r}. Expected a name short enough for host names of at most 63 characters."
        )


def prepare(
    spec: cluster.ClusterSpec, deployment: kubernetes.Deployment, volume: str, *, resolved_by_pod: bool = True,
    doctor: bool = False,
) -> tuple[kubernetes.Deployment, tuple[str, ...]]:
    """Check a deployment; return it with ``--model_dir`` (and ``--cluster kubernetes`` if ``resolved_by_pod``), and
    the pods' command.

    ``resolved_by_pod`` is False where the controller writes TF_CONFIG itself
    (Volcano), and the host names are then ``check_name``'s. With ``doctor``
    the pods run ``DOCTOR_COMMAND`` with ``--model_dir`` alone of the train
    arguments: the same pods, checked before training.

    Raises:
        UserError: ``deployment.check`` fails, ``volume`` is not a claim name,
            a host name would be too long, or ``--model_dir`` is not under
            ``MODEL_MOUNT``.
    """
    deployment.check(spec)
    check_volume(volume)
    args, model_dir = model_dir_args(deployment.train_args, deployment.name)
    command = DOCTOR_COMMAND if doctor else kubernetes.TRAIN_COMMAND
    if doctor:
        args = ("--model_dir", model_dir)
    if resolved_by_pod:
        check_host_names(spec, deployment.name)
        args = ("--cluster", KUBERNETES, *args)
    return dataclasses.replace(deployment, train_args=args), command


def pod_env(spec: cluster.ClusterSpec, subdomain: str) -> list[dict[str, Any]]:
    """The variables ``cluster.kubernetes`` reads that the manifest gives (the controller gives the others)."""
    def label(key: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": f"metadata.labels['{key}']"}}
    shape = json.dumps({t: spec.count(t) for t in spec.tasks}, separators=(",", ":"))
    return [
        {"name": pod_source.TASKS_ENV, "value": shape},
        {"name": pod_source.PORT_ENV, "value": str(run_port(spec))},
        {"name": pod_source.SUBDOMAIN_ENV, "value": subdomain},
        {"name": pod_source.TASK_TYPE_ENV, "valueFrom": label(JOBSET_TYPE_LABEL)},
        {"name": pod_source.JOB_INDEX_ENV, "valueFrom": label(JOBSET_INDEX_LABEL)},
    ]


def failure_policy() -> dict[str, Any]:
    """A JobSet's ``failurePolicy``, matching the Job controller's message for a ``FailJob`` rule (its Jobs'
    ``kubernetes.pod_failure_rules(preempted="fail_job")``).

    The message is "Container C for pod NS/P failed with exit code N matching
    FailJob rule at index I" (or "Pod NS/P has condition DisruptionTarget
    matching FailJob rule ..."). Exit 2 or 3 fails the JobSet; anything else
    (42, an eviction, a crash) restarts every Job, at most ``MAX_RESTARTS`` times.
    """
    permanent = "|".join(str(code) for code in sorted(PERMANENT_EXIT_CODES))
    return {
        "maxRestarts": MAX_RESTARTS,
        "restartStrategy": "Recreate",
        "rules": [
            {"name": "userErrorOrDiverged", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
             "onJobFailureMessagePatterns": [f"with exit code ({permanent}) matching FailJob rule"]},
            {"name": "preemptedOrEvicted", "action": "RestartJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
             "onJobFailureMessagePatterns": [f"with exit code {PREEMPTED_EXIT_CODE} matching FailJob rule",
                                             "has condition DisruptionTarget matching FailJob rule"]},
        ],
    }


def pod_spec(containers: list[dict[str, Any]], volume: str | None) -> dict[str, Any]:
    """A pod's spec: its containers, each mounting ``volume`` (unless None) at ``MODEL_MOUNT``; no restart in place."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",  # a Job's podFailurePolicy requires it; the controller restarts the run
        "terminationGracePeriodSeconds": kubernetes.TERMINATION_GRACE_SECONDS,
        "containers": containers,
    }
    if volume is not None:
        pod["containers"] = [{**c, "volumeMounts": [{"name": VOLUME, "mountPath": MODEL_MOUNT}]} for c in containers]
        pod["volumes"] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": volume}}]
    return pod


def jobset_spec(
    spec: cluster.ClusterSpec, deployment: kubernetes.Deployment, command: Sequence[str], volume: str, subdomain: str,
    trainer: tuple[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A JobSet's spec: one replicated job (one Indexed Job, a pod per task) per task type.

    Args:
        spec: the cluster (task types, counts, the leader's port).
        deployment, command: as ``prepare`` returned them.
        volume: the claim that holds ``--model_dir``.
        subdomain: the pods' subdomain (a JobSet's defaults to its name).
        trainer: ``(container name, job labels)`` of the workers' job for
            Kubeflow Trainer, which fills the container of that name.
    """
    port = run_port(spec)
    replicated = []
    for task_type in spec.tasks:
        count = spec.count(task_type)
        name, labels = trainer if trainer and task_type == "worker" else (kubernetes.CONTAINER, {})
        container = deployment.container(spec, task_type, port, "grpc", env=pod_env(spec, subdomain), command=command)
        container["name"] = name
        job = {
            "completionMode": "Indexed",
            "parallelism": count,
            "completions": count,
            "backoffLimit": 0,
            "podFailurePolicy": {"rules": kubernetes.pod_failure_rules(name, preempted="fail_job")},
            "template": {"metadata": {"labels": kubernetes.run_labels(deployment.name)},
                         "spec": pod_spec([container], volume)},
        }
        template = {"metadata": {"labels": labels}, "spec": job} if labels else {"spec": job}
        replicated.append({"name": task_type, "replicas": 1, "template": template})
    return {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": subdomain},
        "failurePolicy": failure_policy(),
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [spec.leader()[0]]},
        "replicatedJobs": replicated,
    }
