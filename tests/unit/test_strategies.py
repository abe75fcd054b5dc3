"""The strategy registry refuses an unknown name before any strategy is built."""

import pytest

from tfdist import strategies
from tfdist.errors import UserError


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UserError, match=r"strategy='horovod'.*one_device, mirrored, multi_worker_mirrored"):
        strategies.make_strategy("horovod")


def test_the_replicas_on_a_host_without_a_gpu_driver_are_known_without_tensorflow(monkeypatch, tmp_path):
    """The global batch is checked before TensorFlow starts: on Linux without a GPU driver, no import of it.

    (The unit tier fails any test that imports TensorFlow.) A driver's path present means TensorFlow is asked.
    """
    from tfdist.cluster.task import Task
    from tfdist.strategies import host

    monkeypatch.setattr(host.sys, "platform", "linux")
    monkeypatch.setattr(host, "GPU_DRIVER_PATHS", (str(tmp_path / "nvidia"), str(tmp_path / "kfd")))
    assert host.physical_gpus() == 0 and not host.has_gpu()
    local = Task.local()
    assert strategies.replicas_in_sync(strategies.traits("mirrored"), cpu_devices=0, task=local) == 2
    assert strategies.replicas_in_sync(strategies.traits("mirrored"), cpu_devices=3, task=local) == 3
    assert strategies.replicas_in_sync(strategies.traits("one_device"), cpu_devices=0, task=local) == 1
    with pytest.raises(UserError, match=r"global_batch_size=3 with 2 replicas\. Expected a multiple"):
        strategies.check_global_batch(3, 2)
    strategies.check_global_batch(4, 2)
