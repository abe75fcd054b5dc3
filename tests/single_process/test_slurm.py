"""A faked Slurm step read by TensorFlow's SlurmClusterResolver: tfdist's layout is the resolver's."""

from __future__ import annotations


import pytest

from tfdist.cluster import slurm
from unit.test_slurm import CASES, JOB_PORT_BASE, TWO_BY_TWO, bin_dir  # noqa: F401, F811 (a fixture)


def tensorflow_resolver(allocation: slurm.Allocation, jobs: dict[str, int], port_base: int):
    """A ``SlurmClusterResolver`` for ``allocation`` that places this task at ``allocation.position()``."""
    import tensorflow as tf

    class _PlacedSlurmClusterResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
        """The resolver with this task's rank replaced by its position (see tfdist.cluster.slurm's docstring)."""

        def __init__(self, position: int, **kwargs):
            """``position`` is set first: the base constructor reads the rank at once."""
            self._tfdist_position = position
            super().__init__(**kwargs)

        def _resolve_own_rank(self) -> int:
            """This task's index in the address list: its position, not SLURM_PROCID."""
            return self._tfdist_position

    most_per_node = max(allocation.tasks_per_node)
    return _PlacedSlurmClusterResolver(
        allocation.position(),
        jobs=dict(jobs),
        port_base=port_base,
        tasks_per_node=allocation.tasks_by_host(),
        gpus_per_node=most_per_node,  # one pretend GPU per task: GPUs are Slurm's to bind
        gpus_per_task=1,
        auto_set_gpu=False,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_is_tensorflows_slurm_cluster_resolvers(case, bin_dir):
    """``resolve`` lays the cluster out without TensorFlow, exactly as ``SlurmClusterResolver`` does."""
    step, slurm_tasks, _ = CASES[case]
    for rank in range(step.num_tasks):
        allocation = slurm.read_allocation(step.environ(rank, bin_dir))
        jobs = slurm.parse_slurm_tasks(slurm_tasks) or {"worker": allocation.num_tasks}
        resolver = tensorflow_resolver(allocation, jobs, JOB_PORT_BASE)
        cluster, task_type, index = slurm.layout(allocation, jobs, JOB_PORT_BASE)
        assert cluster == resolver.cluster_spec().as_dict()
        assert (task_type, index) == tuple(resolver.get_task_info())


def test_without_scontrol_the_resolvers_expansion_is_used(tmp_path):
    env = TWO_BY_TWO.environ(2, tmp_path)  # tmp_path has no scontrol
    env["PATH"] = str(tmp_path)
    task = slurm.resolve("", env)
    spec, task_type, index = task.spec, task.type, task.index
    assert spec.address(task_type, index) == "node2:12760"

