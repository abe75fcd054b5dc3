"""Kubernetes manifests read back by TensorFlow's own resolver give every task's TF_CONFIG."""

from __future__ import annotations

import json


from tfdist import cluster
from tfdist.deploy import kubernetes as k8s
from unit.test_kubernetes import emitted, load_model, spec_file  # noqa: F401, F811 (fixtures)


def test_manifests_read_back_into_the_same_tf_configs(emitted, spec_file, monkeypatch):
    spec = cluster.load_cluster_spec(spec_file)
    renamed = k8s.dns_spec(spec, "unet")
    assert renamed.as_dict() == {
        "chief": ["unet-chief-0.unet:2222"],
        "worker": ["unet-worker-0.unet:2222", "unet-worker-1.unet:2223"],
        "ps": ["unet-ps-0.unet:2224"],
    }
    service, jobs = load_model(emitted[0]), [load_model(d) for d in emitted[1:]]
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    assert sorted(p.port for p in service.spec.ports) == [2222, 2223, 2224]
    read_back = []
    for job in jobs:
        pod = job.spec.template.spec
        (container,) = pod.containers
        (env,) = [e for e in container.env if e.name == "TF_CONFIG"]
        tf_config = json.loads(env.value)
        task_type, index = tf_config["task"]["type"], tf_config["task"]["index"]
        assert tf_config == cluster.Task(spec=renamed, type=task_type, index=index).tf_config()
        # the task's own address is the DNS name its pod gets from hostname + subdomain (the Service)
        assert renamed.address(task_type, index) == f"{pod.hostname}.{pod.subdomain}:{container.ports[0].container_port}"
        assert pod.subdomain == service.metadata.name == "unet" and job.metadata.name == pod.hostname
        assert service.spec.selector.items() <= job.spec.template.metadata.labels.items()
        assert job.spec.template.metadata.labels["tfdist/task-type"] == task_type
        assert container.command == ["python", "-m", "tfdist.train"]
        assert container.args == ["--strategy", "parameter_server", "--epochs", "2", "--model_dir", "/runs/unet"]
        assert pod.restart_policy == "Never" and job.spec.backoff_limit == 3  # docs/clusters.md: "up to 3 times"
        assert pod.termination_grace_period_seconds == k8s.TERMINATION_GRACE_SECONDS == 90  # docs/clusters.md: 90 s
        assert container.resources.requests == {"cpu": "2", "memory": "4Gi"}  # tfconfig --cpu, --memory defaults
        assert container.resources.limits.get("nvidia.com/gpu") == (None if task_type == "ps" else "1")
        # TensorFlow reads the same cluster and task from it
        monkeypatch.setenv("TF_CONFIG", env.value)
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert (resolver.task_type, resolver.task_id) == (task_type, index)
        assert resolver.cluster_spec().as_dict() == renamed.as_dict()
        read_back.append((task_type, index))
    assert read_back == spec.task_list()

