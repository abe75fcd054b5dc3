"""A cluster's TF_CONFIG read back by TensorFlow's own resolver."""

from __future__ import annotations

import dataclasses

import pytest

from tfdist import cluster
from tfdist.cluster import Task
from unit.test_cluster import CLUSTERS, SPECS, spec_of


@pytest.fixture(scope="module")
def tf_resolver():
    tf = pytest.importorskip("tensorflow")
    return tf.distribute.cluster_resolver.TFConfigClusterResolver


@pytest.mark.parametrize("name", sorted(SPECS) + ["example.yaml", "local_mwm.yaml", "local_ps.yaml"])
def test_tf_config_round_trips_through_tensorflow(name, tf_resolver, monkeypatch):
    spec = cluster.load_cluster_spec(CLUSTERS / name) if name.endswith(".yaml") else spec_of(name)
    assert spec.num_tasks == len(spec.task_list()) >= 1
    for task_type, index in spec.task_list():
        monkeypatch.setenv("TF_CONFIG", Task(spec=spec, type=task_type, index=index).tf_config_json())
        resolver = tf_resolver()
        assert resolver.cluster_spec().as_dict() == spec.as_dict()
        assert (resolver.task_type, resolver.task_id) == (task_type, index)
        # and tfdist reads back what it wrote
        assert cluster.from_environment() == Task(spec=dataclasses.replace(spec, source="TF_CONFIG"), type=task_type,
                                                  index=index)

