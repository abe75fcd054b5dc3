"""The unit tier runs without TensorFlow: a session of unit tests alone fails a test that imports it.

In a session of unit tests only, ``tensorflow`` must not be in ``sys.modules`` before a test (a test
module or helper imported it at collection) nor after it (the test imported it). In a session with the
other tiers TensorFlow is already there, and the check is off.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _unit_only(session) -> bool:
    return all(str(item.path).startswith(HERE + os.sep) for item in session.items)


@pytest.fixture(autouse=True)
def _no_tensorflow(request):
    if not _unit_only(request.session):
        yield
        return
    assert "tensorflow" not in sys.modules, (
        "TensorFlow was imported while collecting the unit tier: a unit test module or what it imports "
        "must not import tensorflow or keras (move the test to tests/single_process/)")
    yield
    assert "tensorflow" not in sys.modules, (
        f"{request.node.nodeid} imported TensorFlow: the unit tier runs without it (move the test to "
        "tests/single_process/)")
