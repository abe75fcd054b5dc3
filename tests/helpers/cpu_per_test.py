"""An opt-in pytest plugin: each test's wall time and CPU time (its pytest worker's and its waited-for children's).

Run ``PYTHONPATH=tests python -m pytest -p helpers.cpu_per_test``: every worker appends a JSON line per test
to ``TFDIST_CPU_LOG`` (default ``cpu_per_test.jsonl``), and the run ends with the CPU-seconds of each file.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import time

import pytest


def _log() -> str:
    return os.environ.get("TFDIST_CPU_LOG", "cpu_per_test.jsonl")


def _cpu() -> tuple[float, float]:
    """CPU-seconds (user + system) of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own, children), start = _cpu(), time.monotonic()
    yield
    (own_after, children_after), wall = _cpu(), time.monotonic() - start
    with open(_log(), "a") as log:
        log.write(json.dumps({"id": item.nodeid, "wall": wall, "self": own_after - own,
                              "children": children_after - children}) + "\n")


def pytest_terminal_summary(terminalreporter, config):
    """On the controller (not an xdist worker): the total, then the CPU-seconds of the heaviest files."""
    if hasattr(config, "workerinput") or not os.path.exists(_log()):
        return
    rows = [json.loads(line) for line in open(_log())]
    by_file = collections.Counter()
    for row in rows:
        by_file[row["id"].split("::")[0]] += row["self"] + row["children"]
    terminalreporter.write_line(f"cpu_per_test: {len(rows)} tests, {sum(by_file.values()):.0f} CPU-seconds "
                                f"({_log()})")
    for path, seconds in by_file.most_common(10):
        terminalreporter.write_line(f"  {seconds:7.1f} {path}")
