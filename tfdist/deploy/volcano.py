"""``tfdist.manifest --form volcano``: a Volcano Job (``batch.volcano.sh/v1alpha1``) with the ``tensorflow``
and ``svc`` plugins.
"""

from __future__ import annotations

from typing import Any

from tfdist import cluster
from tfdist.deploy import kubernetes
from tfdist.deploy import common
from tfdist.errors import PERMANENT_EXIT_CODES, PREEMPTED_EXIT_CODE

API_VERSION = "batch.volcano.sh/v1alpha1"


def volcano_job(
    spec: cluster.ClusterSpec, deployment: kubernetes.Deployment, volume: str, *, doctor: bool = False,
) -> dict[str, Any]:
    """The Volcano Job of ``spec``, named ``deployment.name``, ``--model_dir`` on the claim ``volume``.

    With ``doctor`` its pods run ``tfdist.doctor`` instead of training (``common.prepare``).

    Raises:
        UserError: ``common.prepare`` fails.
    """
    deployment, command = common.prepare(spec, deployment, volume, resolved_by_pod=False, doctor=doctor)
    name, port = deployment.name, common.run_port(spec)
    leader = spec.leader()[0]
    tasks = []
    for task_type in spec.tasks:
        container = deployment.container(spec, task_type, port, "grpc", command=command)
        pod = common.pod_spec([container], None)  # the Job's `volumes` mounts the claim in every pod
        task = {
            "name": task_type,
            "replicas": spec.count(task_type),
            "template": {"metadata": {"labels": kubernetes.run_labels(name)}, "spec": pod},
        }
        if task_type == leader:
            task["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
        tasks.append(task)
    return {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": kubernetes.object_metadata(name, deployment.namespace, kubernetes.run_labels(name)),
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": spec.num_tasks,
            "maxRetry": common.MAX_RESTARTS,
            "plugins": {"tensorflow": [f"--port={port}"], "svc": ["--publish-not-ready-addresses=true"]},
            "volumes": [{"mountPath": common.MODEL_MOUNT, "volumeClaimName": volume}],
            "policies": [
                {"event": "PodEvicted", "action": "RestartJob"},
                {"exitCode": PREEMPTED_EXIT_CODE, "action": "RestartJob"},
                *({"exitCode": code, "action": "TerminateJob"} for code in sorted(PERMANENT_EXIT_CODES)),
            ],
            "tasks": tasks,
        },
    }
