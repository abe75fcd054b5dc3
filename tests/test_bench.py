"""``python -m tfdist.bench``: a small real run writes the JSON, the table and the chart.

Speed is never asserted here (it is measured by the benchmark itself, as
ratios, in docs/benchmarks.md); this checks the benchmark's shape.
"""

import json
import statistics
import subprocess
import sys

import pytest

from conftest import REPO

from tfdist import bench
from tfdist.bench import children
from tfdist.bench.rows import Measured


def test_a_small_benchmark_writes_json_markdown_and_chart(tmp_path):
    out = tmp_path / "b.json"
    result = subprocess.run(
        [sys.executable, "-m", "tfdist.bench", "--only=keras_fit,one_device", "--steps=3", "--repeats=1",
         "--noscaling", f"--output={out}"], capture_output=True, text=True, timeout=400, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["baseline"]["name"] == "keras_fit" and data["baseline"]["images_per_second"] > 0
    names = [r["name"] for r in data["rows"]]
    assert names == ["keras_fit", "one_device"]
    baseline = data["baseline"]["images_per_second"]
    assert data["rows"][0]["images_per_second"] == baseline
    table = out.with_suffix(".md").read_text()
    assert table.startswith("| row |")
    for row in data["rows"]:
        # every ratio is the row's images/s over the baseline's, measured in this run
        assert row["images_per_second"] > 0 and row["peak_rss_mb"] > 0 and row["seconds_to_first_step"] > 0
        assert row["ratio"] == pytest.approx(row["images_per_second"] / baseline, rel=1e-12)
        assert f"| {row['name']} | {row['images_per_second']:.1f} | {row['ratio']:.2f} |" in table
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_every_row_of_the_issue_is_in_the_benchmark():
    names = {r.spec.name for r in bench.rows_for(1, 1)}
    assert names == {"keras_fit", "one_device", "mirrored_1", "mirrored_2", "central_storage_2",
                     "multi_worker_mirrored_1", "multi_worker_mirrored_2", "parameter_server_1",
                     "parameter_server_2", "input_pipeline"}


def test_goals_are_read_off_the_results():
    rows = [{"name": n, "images_per_second": v} for n, v in
            [("keras_fit", 100.0), ("one_device", 120.0), ("mirrored_1", 96.0), ("parameter_server_1", 10.0),
             ("parameter_server_2", 14.0)]]
    rows.append({"name": "input_pipeline", "images_per_second": 100.0, "ratio_to_cached": 0.97})
    goals = {g["goal"]: g for g in bench.goals({"rows": rows, "allreduce": {"share_of_step": 0.2}})}
    assert goals["one_device >= 1.00x keras_fit"]["met"] is True
    assert goals["mirrored_1 >= 0.97x keras_fit"]["met"] is False  # 0.96
    assert goals["input pipeline >= 0.95x cached tensors"]["met"] is True
    assert goals["multi_worker_mirrored_2 all-reduce <= 15% of the step"]["met"] is False
    assert goals["parameter_server_2 >= 1.5x parameter_server_1"]["value"] == 1.4


def test_rows_with_the_same_set_up_share_a_process_and_repeats_interleave():
    rows = bench.rows_for(8, 2) + bench.scaling_rows(4)
    jobs = bench.jobs_for(rows, repeats=2)
    names = [[r.name for r in job.rows] for job in jobs]
    scaling = [r.spec.name for r in bench.scaling_rows(4)]
    assert names[0] == ["keras_fit", "one_device", "mirrored_1", "input_pipeline"] * 2 + scaling  # scaling once
    assert names[1] == ["mirrored_2", "central_storage_2"] * 2
    # A cluster cannot be torn down: each run of a cluster row is a fresh process (or two).
    assert names[2:] == [[n] for n in ("multi_worker_mirrored_1",) * 2 + ("multi_worker_mirrored_2",) * 2
                         + ("parameter_server_1",) * 2 + ("parameter_server_2",) * 2]
    assert [job.processes for job in jobs] == [1, 1] + [1, 1, 2, 2, 1, 1, 1, 1]


def test_unknown_rows_are_refused_by_name():
    from tfdist.errors import UserError

    with pytest.raises(UserError, match=r"--only.*Received: one_devise.*Expected names among: keras_fit"):
        bench.run_benchmark(quick=True, only=["one_devise"])


def _python(code: str):
    return children._start([sys.executable, "-c", code], env={})


def test_children_that_write_much_to_stderr_do_not_block():
    # 256 KB on stderr from each of two children: more than a pipe holds while the other is waited on.
    code = "import sys; sys.stderr.write('x' * (1 << 18)); print('BENCH {\"name\": \"child%d\"}')"
    results = children._collect([_python(code % 0), _python(code % 1)], timeout=60)
    assert results == [[Measured(name="child0")], [Measured(name="child1")]]


def test_a_failed_child_ends_its_peers_at_once():
    import time

    peer = _python("import time; time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"benchmark child failed \(3\): boom"):
        children._collect([peer, _python("import sys; sys.stderr.write('boom'); sys.exit(3)")], timeout=120)
    assert time.monotonic() - started < 30  # the peer was killed, not waited for (it sleeps 60 s)


def test_the_train_step_profile_runs_and_prints_each_step_against_keras():
    result = subprocess.run([sys.executable, "examples/profile_train_step.py", "--blocks=3", "--steps=1"],
                            capture_output=True, text=True, timeout=400, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [line[0].rstrip(":") for line in lines] == ["tfdist", "tfdist_no_stats", "keras"]
    assert all(float(line[1]) > 0 for line in lines) and lines[-1][3] == "(1.000x"


def test_a_child_job_and_its_results_cross_the_process_boundary_unchanged():
    from tfdist.bench.rows import ChildJob

    job = ChildJob(rows=tuple(r.spec for r in bench.rows_for(4, 2)), spawned_at=12.5)
    assert ChildJob.from_json(job.to_json()) == job
    measured = Measured(name="one_device", images_per_second=90.0, num_replicas=1, peak_rss_mb=800.0)
    assert measured.to_line().startswith("BENCH ") and Measured.from_line(measured.to_line()) == measured
    assert "cached_images_per_second" not in measured.to_dict()  # not measured: not in the JSON


def test_the_report_writes_medians_ratios_and_the_json_keys_of_each_part():
    from tfdist.bench.plan import plan
    from tfdist.bench.report import markdown, results

    rows = plan(steps=8, warmup=2, scaling_steps=4)
    runs = {}
    for row in rows.every_row:
        numbers = ({"allreduce_seconds": 0.01, "gradient_mb": 2.0} if row.spec.kind == "allreduce"
                   else {"images_per_second": 100.0, "seconds_to_first_step": 9.0})
        # factors whose median (1.5) is not their mean (1.83): medians, not means, make the report
        runs[row.spec.name] = [Measured(name=row.spec.name, peak_rss_mb=700.0, row_seconds=3.0, rss_growth_mb=50.0,
                                        **{k: v * f for k, v in numbers.items()}) for f in (1.0, 1.5, 3.0)]
    runs["one_device"] = [Measured(name="one_device", images_per_second=v, num_replicas=1, peak_rss_mb=700.0)
                          for v in (120.0, 180.0, 165.0)]
    out = json.loads(json.dumps(results(rows, runs, {"steps": 8})))  # as written
    assert out["baseline"] == {"name": "keras_fit", "images_per_second": 150.0, "seconds_to_first_step": 13.5,
                               "peak_rss_mb": 700.0, "row_seconds": 3.0, "rss_growth_mb": 50.0,
                               "runs": [100.0, 150.0, 300.0]}
    one_device = out["rows"][1]
    assert list(one_device) == ["name", "images_per_second", "ratio", "num_replicas", "peak_rss_mb", "runs"]
    assert one_device["images_per_second"] == statistics.median(one_device["runs"]) == 165.0
    assert one_device["runs"] == [120.0, 180.0, 165.0] and one_device["ratio"] == 165.0 / 150.0
    for row in out["rows"]:
        assert row["ratio"] == row["images_per_second"] / out["baseline"]["images_per_second"]
    assert list(out["allreduce"]) == ["allreduce_seconds", "gradient_mb", "peak_rss_mb", "row_seconds",
                                      "rss_growth_mb", "runs", "share_of_step"]
    assert out["allreduce"]["share_of_step"] == 0.015 / (16 / 150.0)
    assert [s["name"] for s in out["scaling"]] == [r.spec.name for r in bench.scaling_rows(4)]
    assert out["scaling"][0] == {"name": "epoch_32px_1x", "image_size": 32, "factor": 1,
                                 "epoch_seconds": 4 * 16 / 150.0, "peak_rss_mb": 700.0, "rss_growth_mb": 50.0}
    assert [g["met"] for g in out["goals"]][:2] == [True, True]
    assert markdown(out).startswith("| row |")


#: The preemption test's experiment: the benchmark's, with a tiny model and batch (a start costs ~10-15 s here).
TINY = {"train_examples": 64, "eval_examples": 16, "base_filters": 4, "depth": 2, "global_batch_size": 8}


def test_a_preemption_of_one_device_ends_42_and_resumes_at_the_step_it_reached():
    from tfdist.bench.preemption import PreemptionSpec, measure

    spec = PreemptionSpec(name="preemption_one_device", strategy="one_device", steps=16, signal_at=4,
                          overrides=TINY, timeout=120)
    m = measure(spec)
    assert m.statuses == (42, 0)
    assert 4 <= m.reached_step < 16 and m.resumed_step == m.reached_step
    assert m.exit_seconds > 0 and m.fresh_first_step_seconds > 0 and m.resumed_first_step_seconds > 0
    assert m.resume_ratio == m.resumed_first_step_seconds / m.fresh_first_step_seconds


def test_the_step_reached_is_one_step_of_every_task_or_the_measurement_fails():
    from tfdist.bench.preemption import PreemptionSpec, _reached_step

    two = PreemptionSpec(name="p", strategy="multi_worker_mirrored", workers=2)
    line = "[worker:{}] error: Preempted at step {} of 24: worker:1 received SIGTERM. Saved ..."
    assert _reached_step("\n".join([line.format(0, 9), "[launch] exit status 42", line.format(1, 9)]), two) == 9
    for text in (line.format(0, 9), "\n".join([line.format(0, 9), line.format(1, 10)])):
        with pytest.raises(RuntimeError, match="expected 2 `error: Preempted at step N` line"):
            _reached_step(text, two)


def test_preemption_rows_are_selected_like_rows_and_reported_under_their_own_key():
    from tfdist.bench.plan import plan
    from tfdist.bench.preemption import markdown as preemption_table
    from tfdist.errors import UserError

    every = plan(steps=8, warmup=2, preemption=True)
    assert [s.name for s in every.preemption] == ["preemption_one_device", "preemption_multi_worker_mirrored_2"]
    assert [s.workers for s in every.preemption] == [1, 2]
    assert plan(steps=8, warmup=2).preemption == ()  # --nopreemption
    assert plan(steps=8, warmup=2, only=["one_device"], preemption=True).preemption == ()
    alone = plan(steps=8, warmup=2, only=["preemption_one_device"], preemption=True)
    assert [s.name for s in alone.preemption] == ["preemption_one_device"]
    assert [r.spec.name for r in alone.rows] == ["keras_fit"]  # the baseline runs whatever --only says
    with pytest.raises(UserError, match="--nopreemption"):
        plan(steps=8, warmup=2, only=["preemption_one_device"])
    section = {"runs": 1, "rows": [{"name": "preemption_one_device", "strategy": "one_device", "workers": 1,
                                    "steps": 24, "signal_at": 8, "exit_seconds": 1.04,
                                    "fresh_first_step_seconds": 20.0, "resumed_first_step_seconds": 25.0,
                                    "resume_ratio": 1.25, "reached_step": 9, "resumed_step": 9,
                                    "statuses": [42, 0], "row_seconds": 60.0}]}
    table = preemption_table(section)
    assert table[2] == "| preemption_one_device | 1.0 | 20.0 | 25.0 | 1.25 | 9 | 9 |"
    assert table[-1].startswith("One run of each preemption row (not repeated): SIGTERM once a train row at step "
                                "8 of 24 or later")
    from tfdist.bench.report import markdown, results

    out = results(alone, {"keras_fit": [Measured(name="keras_fit", images_per_second=100.0)]}, {}, preemption=section)
    assert out["preemption"] == section and "| preemption_one_device | 1.0 |" in markdown(out)
