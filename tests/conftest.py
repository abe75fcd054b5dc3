"""Test-wide set-up: 2 logical CPUs and a quiet TensorFlow, before TensorFlow starts.

Keras' own distributed tests split CPU:0 into logical devices the same way,
so that ``mirrored`` and ``central_storage`` have 2 replicas on a machine
without GPUs. Tests that need a fresh runtime (clusters, other device
counts) run in subprocesses. Each pytest worker picks its ports in a range
of its own, below the ephemeral range (``TFDIST_PORT_RANGE``, see
``cluster_runs.worker_port_range``).
"""

import os
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from cluster_runs import ephemeral_low, worker_port_range  # noqa: E402

# Every cluster of this pytest worker (its cluster files, tfdist.launch --local, in-process servers) and
# every process it starts (they inherit the environment) picks ports in this worker's own range.
os.environ["TFDIST_PORT_RANGE"] = worker_port_range(
    os.environ.get("PYTEST_XDIST_WORKER", "master"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
    ephemeral_low())

from tfdist.strategies import setup_host  # noqa: E402

setup_host(cpu_devices=2, inter_op_threads=4)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code_or_args, *, timeout: float = 240, env=None, cwd=None):
    """Run ``python -c CODE`` (a str) or ``python ARGS...`` (a list) in a fresh process, bounded."""
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or REPO
    )


#: The longest tests (a minute or more each on 2 cores, measured), started first: pytest-xdist hands tests
#: out in collection order, and one of them started last would run alone while the other worker idles.
SLOW_FIRST = (
    "tests/test_slurm_cluster.py", "tests/test_notebooks.py::test_notebook_executes_top_to_bottom",
    "tests/test_preemption.py::test_a_run_resumes_on_another_world_size",
    "tests/test_faults.py::test_the_launcher_restarts", "tests/test_fit.py",
    "tests/test_preemption.py::test_parameter_server_a_preempted_worker", "tests/test_multi_worker.py",
    "tests/test_watchdog.py", "tests/test_netns.py", "tests/test_ray.py", "tests/test_keras_fit.py",
    "tests/test_fit_setup.py", "tests/test_fit_custom_steps.py", "tests/test_fit_weights_and_hooks.py",
)


def pytest_collection_modifyitems(config, items):
    """``SLOW_FIRST`` tests first; the others keep their order (a stable sort)."""
    items.sort(key=lambda item: not item.nodeid.startswith(SLOW_FIRST))


@pytest.fixture
def python():
    """``run_python`` as a fixture."""
    return run_python
