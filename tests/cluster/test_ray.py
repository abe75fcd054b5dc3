"""Ray Train: ``examples/ray_train_keras.py`` on a real local Ray cluster, 2 workers.

Ray Train's ``TensorflowTrainer`` sets TF_CONFIG on each of its workers (type
``worker``, index = its world rank, every worker's address on a port Ray
picked). Ray's own TensorFlow example (``MultiWorkerMirroredStrategy()``,
``model.fit``) fails there on Keras 3 with 2 workers (ray-project/ray#47464,
keras-team/keras#20585: "Attempt to convert a value (PerReplica:{...})",
measured with Ray 2.60, TF 2.21, Keras 3.15). The example is Ray's, with
``tfdist.setup("multi_worker_mirrored")`` in place of the strategy's line
(``model.fit``), or with ``tfdist.fit`` inside ``train_loop_per_worker``
(``--tfdist_fit``). Each worker writes its own History to ``rank<R>.json``:
every epoch's loss is finite, lower than the one before, and the same on both
workers (they were equal to the bit, measured; the tolerance is 1e-6), and
Ray's own result reports the last of them.

The example runs as a user runs it, ``python examples/ray_train_keras.py``
(its ``ray.init()`` starts the local cluster, its ``ray.shutdown()`` stops
it), in a process group of its own, bounded. Ray is kept off the network: no
usage stats, no dashboard, and every Ray process on 127.0.0.1
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's local-only mode, which is what
it does on macOS and Windows; TF_CONFIG's addresses are 127.0.0.1 too). Ray's
session files go to a short directory of the test's own (Unix socket paths
are limited to 107 characters). Every process seen below the example while it
ran must be gone soon after it ends; leftovers are killed by pid and fail the
test. Most of each test's time is Ray's start and the imports of TensorFlow
in its processes (the driver, Ray Train's controller, each worker); they
share an xdist group so as to run one after the other, as two Ray clusters
at once on 2 cores each run much slower.
"""

from __future__ import annotations

import ast
import json
import math
import shutil
import sys
import tempfile
import time

import psutil
import pytest

from helpers.cluster_runs import REPO, Processes, alive

EXAMPLE = REPO / "examples" / "ray_train_keras.py"
EPOCHS = 3
#: The workers' losses were bit-for-bit equal in every run measured.
TOLERANCE = 1e-6
#: The example alone: 55-80 s on 2 cores, 126 s with the other one beside it; room for a loaded machine.
TIMEOUT = 300
#: One pytest worker for both, one after the other: two Ray clusters at once doubled each one's time.
RAY = pytest.mark.xdist_group("ray")
#: Seconds the processes Ray started may take to go once the example has ended (ray.shutdown, fate-sharing).
GRACE = 15


def run_example(tmp_path, *flags: str) -> dict:
    """Run the example on a fresh local Ray cluster; the workers' records, by rank, and Ray's final metrics."""
    losses_dir = tmp_path / "losses"
    losses_dir.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    argv = [sys.executable, str(EXAMPLE), *flags, f"--epochs={EPOCHS}", "--steps-per-epoch=8",
            f"--storage-path={tmp_path / 'ray_results'}", f"--losses_dir={losses_dir}"]
    started = time.monotonic()
    try:
        with Processes(tmp_path) as processes:
            proc = processes.start(
                "example", argv, RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0",
                RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
            status, seen = proc.wait_watching(TIMEOUT)
            deadline = time.monotonic() + GRACE
            while alive(seen) and time.monotonic() < deadline:
                time.sleep(0.5)
            left = alive(seen)
            for pid in left:  # only what this example started (seen below it while it ran)
                try:
                    psutil.Process(pid).kill()
                except psutil.NoSuchProcess:
                    pass
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    text = proc.text()
    print(f"{' '.join(flags) or 'model.fit'}: {time.monotonic() - started:.1f} s")
    assert status == 0, f"the example ended with status {status}:\n{text[-6000:]}"
    assert not left, f"Ray processes left {GRACE} s after the example ended (killed): {left}"
    records = {}
    for rank in range(2):
        path = losses_dir / f"rank{rank}.json"
        assert path.exists(), f"worker {rank} wrote no {path.name}:\n{text[-3000:]}"
        records[rank] = json.loads(path.read_text())
    final = [line for line in text.splitlines() if line.startswith("Final metrics: ")]
    assert final, text[-3000:]
    return {"workers": records, "final": ast.literal_eval(final[-1][len("Final metrics: "):])}


def check_run(run: dict) -> None:
    workers, final = run["workers"], run["final"]
    # Ray's TF_CONFIG: one cluster of 2 workers, this worker's index its world rank, in 2 processes.
    clusters = {json.dumps(w["tf_config"]["cluster"], sort_keys=True) for w in workers.values()}
    assert len(clusters) == 1 and len(workers[0]["tf_config"]["cluster"]["worker"]) == 2, workers
    for rank, w in workers.items():
        assert w["tf_config"]["task"] == {"type": "worker", "index": rank}
    assert workers[0]["pid"] != workers[1]["pid"]
    losses = {rank: w["history"]["loss"] for rank, w in workers.items()}
    print("losses per worker:", losses)
    for rank, loss in losses.items():
        assert len(loss) == EPOCHS and all(math.isfinite(v) for v in loss), (rank, loss)
        assert all(b < a for a, b in zip(loss, loss[1:])), f"worker {rank}'s loss does not decrease: {loss}"
    for a, b in zip(losses[0], losses[1]):
        assert abs(a - b) <= TOLERANCE, f"the workers' losses differ: {losses}"
    # Ray's own reporting carries the same figures.
    assert abs(final["loss"] - losses[0][-1]) <= TOLERANCE, (final, losses)


@pytest.mark.slow
@RAY
def test_keras_model_fit_trains_under_ray_train_with_tfdist_setup(tmp_path):
    check_run(run_example(tmp_path))


@pytest.mark.slow
@RAY
def test_tfdist_fit_trains_inside_train_loop_per_worker(tmp_path):
    check_run(run_example(tmp_path, "--tfdist_fit"))
