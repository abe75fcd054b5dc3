"""``tfdist.manifest --form jobset``: one JobSet (``jobset.x-k8s.io/v1alpha2``) that runs every task of a
cluster spec.
"""

from __future__ import annotations

from typing import Any

from tfdist import cluster
from tfdist.deploy import kubernetes
from tfdist.deploy import common

API_VERSION = "jobset.x-k8s.io/v1alpha2"


def jobset(
    spec: cluster.ClusterSpec, deployment: kubernetes.Deployment, volume: str, *, doctor: bool = False,
) -> dict[str, Any]:
    """The JobSet of ``spec``, named ``deployment.name``, ``--model_dir`` on the claim ``volume``.

    With ``doctor`` its pods run ``tfdist.doctor`` instead of training (``common.prepare``).

    Raises:
        UserError: ``common.prepare`` fails.
    """
    deployment, command = common.prepare(spec, deployment, volume, doctor=doctor)
    name = deployment.name
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": kubernetes.object_metadata(name, deployment.namespace, kubernetes.run_labels(name)),
        "spec": common.jobset_spec(spec, deployment, command, volume, subdomain=name),
    }
