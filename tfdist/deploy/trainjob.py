"""``tfdist.manifest --form trainjob``: a Kubeflow Trainer v2 TrainJob over a plain TrainingRuntime of its own."""

from __future__ import annotations

from typing import Any

from tfdist import cluster
from tfdist.deploy import kubernetes
from tfdist.deploy import common

API_VERSION = "trainer.kubeflow.org/v1alpha1"

#: The container Trainer fills from a TrainJob's ``trainer``, and the label of the job it lives in.
TRAINER_CONTAINER = "node"
TRAINER_STEP_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


def trainjob(
    spec: cluster.ClusterSpec, deployment: kubernetes.Deployment, volume: str, *, doctor: bool = False,
) -> list[dict[str, Any]]:
    """The TrainingRuntime and the TrainJob of ``spec``, both named ``deployment.name``.

    With ``doctor`` its pods run ``tfdist.doctor`` instead of training (``common.prepare``).

    Raises:
        UserError: ``common.prepare`` fails.
    """
    deployment, command = common.prepare(spec, deployment, volume, doctor=doctor)
    name, namespace = deployment.name, deployment.namespace
    labels = kubernetes.run_labels(name)
    trainer = (TRAINER_CONTAINER, {TRAINER_STEP_LABEL: "trainer"})
    runtime = {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": kubernetes.object_metadata(name, namespace, labels),
        "spec": {
            "mlPolicy": {"numNodes": spec.count("worker")},
            "template": {"spec": common.jobset_spec(
                spec, deployment, command, volume, subdomain=name, trainer=trainer,
            )},
        },
    }
    job = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": kubernetes.object_metadata(name, namespace, labels),
        "spec": {"runtimeRef": {"name": name, "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}},
    }
    return [runtime, job]
