"""Clusters of real processes on 127.0.0.1 under ``tfdist.launch``: what every task does.

- ``multi_worker_mirrored``, 2 workers: both end with the same weights, the
  same (to float32 rounding) as one process with the global batch (over a
  short run: longer ones drift apart, see ``cluster_runs.EXPERIMENT``).
- ``multi_worker_mirrored``, 2 workers and an evaluator over the longer run:
  worker 0 alone writes the run's outputs; the images it counts (each eval,
  each logged window of steps) are those of every replica of every worker;
  the evaluator, which joins no collective, evaluates each checkpoint into
  its own files.
- ``parameter_server``, a chief, 2 workers, 1 ps and an evaluator: the
  variables live on the ps task, every step is done, and the ps and worker
  tasks end by themselves (status 0) once the chief is done.

The uninterrupted multi-worker run is shared with ``test_faults.py``, which
compares interrupted and resumed runs against it.
"""

from __future__ import annotations

import json
import re

from helpers.cluster_runs import (
    EXPERIMENT, SHARED_RUN, SHORT, Processes, launched_multi_worker, launcher,
    loopback_cluster, max_difference, npz_weights, train_command,
)
from helpers.outputs import exported_weights, rows


def test_two_workers_match_each_other_and_one_process_with_the_global_batch(tmp_path):
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    model_dir, weights, single = tmp_path / "run", tmp_path / "weights", tmp_path / "one_device"
    with Processes(tmp_path) as procs:  # both at once: the cluster and the single process
        cluster_run = procs.start("launch", launcher(cluster, *train_command(
            "--strategy=multi_worker_mirrored", *SHORT, "--export", f"--model_dir={model_dir}",
            f"--dump_weights={weights}")))
        single_run = procs.start("one_device", train_command("--strategy=one_device", *SHORT, "--export",
                                                             f"--model_dir={single}"))
        assert cluster_run.wait(300) == 0, cluster_run.text()[-4000:]
        assert single_run.wait(300) == 0, single_run.text()[-4000:]
    w0, w1 = (npz_weights(weights / f"worker-{i}.npz") for i in (0, 1))
    assert max_difference(w0, w1) == 0.0  # both apply the same all-reduced gradients
    assert max_difference(w0, exported_weights(model_dir)) == 0.0  # the leader's export is its model
    assert max_difference(w0, exported_weights(single)) < 5e-5  # measured 8e-6 (largest weight 1.2)


@SHARED_RUN
def test_over_the_long_run_too_both_workers_end_with_the_same_weights(tmp_path_factory):
    run = launched_multi_worker(tmp_path_factory)
    assert run["status"] == 0, run["text"][-4000:]
    w0, w1 = (npz_weights(run["weights"] / f"worker-{i}.npz") for i in (0, 1))
    assert max_difference(w0, w1) == 0.0
    assert not (run["weights"] / "evaluator-0.npz").exists()  # the evaluator trains nothing


@SHARED_RUN
def test_worker_0_alone_writes_the_outputs_and_every_line_names_its_task(tmp_path_factory):
    run = launched_multi_worker(tmp_path_factory)
    text, model_dir = run["text"], run["model_dir"]
    assert "[worker:0] tfdist: multi_worker_mirrored with 2 replicas" in text
    assert re.search(r"^\[worker:1\] final eval: ", text, re.M) and re.search(r"^\[worker:0\] final eval: ", text, re.M)
    train_steps = [r["step"] for r in rows(model_dir / "metrics.jsonl") if r["split"] == "train"]
    assert train_steps == list(range(5, 41, 5))  # once each: worker 1 wrote none
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["num_replicas"] == 2
    assert summary["largest_chunk"] >= 2  # chunks grew on both workers alike (the weights above: the same)
    for name in ("worker:0", "worker:1", "evaluator:0"):
        assert f"[launch] {name} exited with status 0" in text


def flag(name: str) -> int:
    """The value of ``--name`` in the shared experiment's flags (``cluster_runs.EXPERIMENT``)."""
    return int(next(f.split("=", 1)[1] for f in EXPERIMENT if f.startswith(f"--{name}=")))


@SHARED_RUN
def test_the_images_counted_are_every_replicas_of_every_worker(tmp_path_factory):
    """Each worker evaluates half of the eval split: worker 0's count is the whole split, not its half."""
    run = launched_multi_worker(tmp_path_factory)
    assert run["status"] == 0, run["text"][-4000:]
    metrics = rows(run["model_dir"] / "metrics.jsonl")
    evals = [r["images"] for r in metrics if r["split"] == "eval"]
    assert evals and set(evals) == {flag("eval_examples")}, evals
    trains = [r["images"] for r in metrics if r["split"] == "train"]
    assert trains and set(trains) == {flag("log_every") * flag("global_batch_size")}, trains
    evaluator = [r["images"] for r in rows(run["model_dir"] / "evaluator.jsonl")]
    assert evaluator and set(evaluator) == {flag("eval_examples")}, evaluator  # one process, the whole split


@SHARED_RUN
def test_the_evaluator_evaluates_each_checkpoint_into_its_own_files(tmp_path_factory):
    run = launched_multi_worker(tmp_path_factory)
    model_dir = run["model_dir"]
    evaluated = rows(model_dir / "evaluator.jsonl")
    assert {r["split"] for r in evaluated} == {"evaluator"}
    # One row per checkpoint the chief wrote (every 10 steps), oldest first. The chief keeps the last 3, so
    # ckpt-10 is gone once ckpt-40 is written: an evaluator starved of the CPU for those 30 steps would
    # legitimately miss it. The others are never rotated away in this run.
    steps = [r["step"] for r in evaluated]
    assert steps in ([10, 20, 30, 40], [20, 30, 40]), steps
    assert len({r["loss"] for r in evaluated}) == len(evaluated)  # each row a model of its own
    chief_final = [r for r in rows(model_dir / "metrics.jsonl") if r["split"] == "eval"][-1]
    assert abs(evaluated[-1]["loss"] - chief_final["loss"]) < 1e-5  # the same weights, the same eval split
    assert not any(r["split"] == "evaluator" for r in rows(model_dir / "metrics.jsonl"))
    assert list((model_dir / "tensorboard" / "evaluator").glob("events.*"))
    assert "[evaluator:0] evaluator step 40: loss" in run["text"]


def test_parameter_server_cluster_trains_with_variables_on_the_ps_task(tmp_path):
    cluster = loopback_cluster(tmp_path / "cluster.yaml", chief=1, worker=2, ps=1, evaluator=1)
    model_dir = tmp_path / "run"
    flags = [f.replace("steps_per_epoch=40", "steps_per_epoch=12") for f in EXPERIMENT]
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(
            cluster, *train_command("--strategy=parameter_server", *flags, f"--model_dir={model_dir}")))
        status = proc.wait(300)
    text = proc.text()
    assert status == 0, text[-4000:]
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["steps"] == 12  # no worker lost: each of the 12 scheduled closures ran once
    per_worker = summary["closures_per_worker"]  # both workers trained, and no closure twice
    assert sorted(per_worker) == ["worker:0", "worker:1"] and all(n > 0 for n in per_worker.values()), per_worker
    assert sum(per_worker.values()) == 12, per_worker
    assert summary["variable_devices"] and all("/job:ps/" in d for d in summary["variable_devices"])
    for name in ("chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"):
        assert f"[launch] {name} exited with status 0" in text  # each ended by itself
    assert "stopping them" not in text
    assert "[ps:0] tfdist: ps:0 at" in text and "chief:0 ended with status 0 (done); stopping" in text
    assert [r["step"] for r in rows(model_dir / "evaluator.jsonl")] == [10, 12]  # ckpt-10 and the final one
