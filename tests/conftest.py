"""Test-wide set-up, without TensorFlow: quiet logs, this worker's ports, the ``python`` fixture, the tiers' order.

The tiers are folders: ``unit/`` (no TensorFlow runtime, seconds), ``single_process/`` (TensorFlow in
one process) and ``cluster/`` (real processes: launchers, schedulers, network namespaces, multi-worker
runs); ``helpers/`` holds what they share. The TensorFlow tiers set the host up in their own conftest.
Each pytest worker picks its ports in a range of its own, below the ephemeral range
(``TFDIST_PORT_RANGE``, see ``helpers.cluster_runs.worker_port_range``).
"""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from helpers.cluster_runs import ephemeral_low, worker_port_range  # noqa: E402
from helpers.clis import run_python  # noqa: E402

# Every cluster of this pytest worker (its cluster files, tfdist.launch --local, in-process servers) and
# every process it starts (they inherit the environment) picks ports in this worker's own range.
os.environ["TFDIST_PORT_RANGE"] = worker_port_range(
    os.environ.get("PYTEST_XDIST_WORKER", "master"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
    ephemeral_low())

#: The tiers in the order their tests start: pytest-xdist hands tests out in collection order, so the
#: long waits of the cluster tier overlap on both workers, and the quick tiers fill the gaps at the end.
TIERS = ("cluster", "single_process", "unit")


def tier(item) -> str:
    """The tier folder a test lives in (``""`` outside the tiers)."""
    parts = item.path.relative_to(os.path.dirname(__file__)).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else ""


def pytest_collection_modifyitems(config, items):
    """Cluster tier first, then single-process, then unit; ``slow`` tests first within a tier (a stable sort)."""
    order = {name: rank for rank, name in enumerate(TIERS)}
    items.sort(key=lambda item: (order.get(tier(item), len(TIERS)), item.get_closest_marker("slow") is None))


@pytest.fixture
def python():
    """``helpers.clis.run_python`` as a fixture."""
    return run_python
