"""The unit tier runs without TensorFlow: in a session of unit tests alone, importing it fails.

``tensorflow`` must not be in ``sys.modules`` once the unit tier is collected (a test module or a helper
imported it: every test fails) nor appear during a test (that test fails). In a session with the other
tiers TensorFlow is already there, and the check is off.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_collected_with_tensorflow = False


def _unit_only(session) -> bool:
    return all(str(item.path).startswith(HERE + os.sep) for item in session.items)


def pytest_collection_finish(session):
    global _collected_with_tensorflow
    _collected_with_tensorflow = "tensorflow" in sys.modules


@pytest.fixture(autouse=True)
def _no_tensorflow(request):
    if not _unit_only(request.session):
        yield
        return
    assert not _collected_with_tensorflow, (
        "TensorFlow was imported while collecting the unit tier: a unit test module or what it imports "
        "must not import tensorflow or keras (move the test to tests/single_process/)")
    before = "tensorflow" in sys.modules
    yield
    assert before or "tensorflow" not in sys.modules, (
        f"{request.node.nodeid} imported TensorFlow: the unit tier runs without it (move the test to "
        "tests/single_process/)")
