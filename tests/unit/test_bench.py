"""``python -m tfdist.bench``: its method (pairing, windows, records, sums), a small real run, and the docs it renders.

Speed is never asserted here (it is measured by the benchmark itself, as
paired ratios, in docs/benchmarks.md); this checks how it measures.
"""

import dataclasses
import json
import re

import pytest

from helpers.clis import REPO, assert_user_error, python_argv, run_cli

from tfdist import bench
from tfdist.bench import children
from tfdist.bench.plan import jobs_for, plan
from tfdist.bench.report import results
from tfdist.bench.rows import Job, Measured


def test_every_documented_row_is_in_the_benchmark():
    names = {r.spec.name for r in bench.rows_for(1, 1)}
    for family in ("multi_worker_mirrored", "parameter_server"):
        assert {f"{family}_{n}" for n in (1, 2, 3, 4)} <= names
    assert {"keras_fit", "keras_fit_mirrored_2", "keras_fit_central_storage_2", "one_device", "mirrored_1",
            "mirrored_2", "central_storage_2", "input_pipeline", "allreduce_2", "allreduce_4", "traced_step_2",
            "multi_worker_mirrored_2_group_norm", "multi_worker_mirrored_2_replica_batch_norm",
            "tfdist_fit", "tfdist_fit_mirrored_2", "keras_fit_multi_worker_mirrored_2"} <= names
    every = plan(steps=8, warmup=4, scaling_steps=4, accuracy=True, preemption=True)
    assert [s.strategy for s in every.accuracy][:3] == ["one_device", "mirrored", "multi_worker_mirrored"]
    assert "parameter_server" in [s.strategy for s in every.accuracy]


def test_every_run_is_a_fresh_process_next_to_its_baseline_and_odd_repeats_run_backwards():
    rows = bench.rows_for(8, 4) + bench.scaling_rows(4)
    jobs = jobs_for(rows, repeats=2)
    first = [j.rows[0].name for j in jobs if j.repeat == 0 and len(j.rows) == 1]
    second = [j.rows[0].name for j in jobs if j.repeat == 1]
    assert first[:3] == ["keras_fit", "tfdist_fit", "one_device"]
    assert first.index("tfdist_fit_mirrored_2") == first.index("keras_fit_mirrored_2") + 1  # pairs run side by side
    assert first.index("mirrored_2") == first.index("keras_fit_mirrored_2") + 2  # the second one a row further
    assert first.index("central_storage_2") == first.index("keras_fit_central_storage_2") + 1
    once = {"allreduce_2", "allreduce_4", "traced_step_2"}
    assert second == [n for n in first[::-1] if n not in once]  # the once-only rows run in the first repeat
    assert all(len(j.rows) == 1 for j in jobs[:-1])  # a row's run shares its process with no other row
    assert [r.name for r in jobs[-1].rows] == [r.spec.name for r in bench.scaling_rows(4)]  # one process, once
    by_name = {j.rows[0].name: j.processes for j in jobs}
    assert [by_name[f"multi_worker_mirrored_{n}"] for n in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert by_name["parameter_server_4"] == 1  # an in-process cluster: one process


def test_ratios_are_paired_by_repeat_and_a_row_reports_one_repeats_record():
    planned = plan(steps=8, warmup=4, only=["mirrored_2"])
    assert [r.spec.name for r in planned.rows] == ["keras_fit", "keras_fit_mirrored_2", "mirrored_2"]

    def runs(name, ips, memory):
        return [Measured(name=name, repeat=i, images_per_second=v, global_batch_size=16, num_replicas=2,
                         peak_rss_mb=m, seconds_to_first_step=10.0 + i) for i, (v, m) in enumerate(zip(ips, memory))]

    measured = {"keras_fit": runs("keras_fit", [100.0, 200.0, 100.0], [1.0, 2.0, 3.0]),
                "keras_fit_mirrored_2": runs("keras_fit_mirrored_2", [50.0, 100.0, 80.0], [1.0, 2.0, 3.0]),
                "mirrored_2": runs("mirrored_2", [110.0, 120.0, 90.0], [700.0, 800.0, 900.0])}
    out = json.loads(json.dumps(results(planned, measured, {})))
    row = out["rows"][2]
    # Per repeat: 1.10, 0.60, 0.90 -> median 0.90 (repeat 2); the ratio of medians would be 110/100 = 1.10.
    assert row["ratio"]["runs"] == pytest.approx([1.1, 0.6, 0.9])
    assert (row["ratio"]["median"], row["ratio"]["min"], row["ratio"]["max"]) == pytest.approx((0.9, 0.6, 1.1))
    assert row["ratio_to_baseline"]["to"] == "keras_fit_mirrored_2"
    assert row["ratio_to_baseline"]["runs"] == pytest.approx([2.2, 1.2, 90 / 80])
    # The record is repeat 2's, every figure of it (not the median of each figure: 110 images/s, 800 MB).
    assert row["record"]["repeat"] == 2 and row["record"]["images_per_second"] == 90.0
    assert row["record"]["peak_rss_mb"] == 900.0 and row["record"]["seconds_to_first_step"] == 12.0
    assert row["record"]["peak_rss_mb_per_replica"] == 450.0
    assert row["images_per_second"]["median"] == 110.0
    goal = {g["goal"]: g for g in out["goals"]}["mirrored_2 >= 1.00x keras_fit_mirrored_2"]
    assert goal["value"] == pytest.approx(1.2) and goal["met"] is True and goal["min"] == pytest.approx(90 / 80)


def test_tfdist_fit_and_keras_fit_across_workers_run_next_to_the_row_they_are_compared_to():
    rows = {r.spec.name: r for r in bench.rows_for(8, 4)}
    # tfdist.fit gets Keras' experiment (model, batch, steps, warm-up), runs it twice and times the second epoch.
    for fit, keras in (("tfdist_fit", "keras_fit"), ("tfdist_fit_mirrored_2", "keras_fit_mirrored_2")):
        assert rows[fit].spec.kind == "tfdist_fit" and rows[fit].spec.strategy == (rows[keras].spec.strategy
                                                                                   or "one_device")
        assert rows[fit].spec.experiment() == rows[keras].spec.experiment()
        assert (rows[fit].spec.steps, rows[fit].spec.warmup, rows[fit].spec.epochs) == (8, 4, 2)
    assert rows["tfdist_fit"].spec.baseline is None  # its ratio is the one to keras_fit
    assert rows["tfdist_fit_mirrored_2"].spec.baseline == "keras_fit_mirrored_2"
    # Keras' own fit across 2 worker processes: the tfdist row's strategy, processes and global batch.
    keras_mwm, mwm = rows["keras_fit_multi_worker_mirrored_2"], rows["multi_worker_mirrored_2"]
    assert (keras_mwm.spec.kind, keras_mwm.spec.strategy, keras_mwm.processes) == ("keras_fit", "multi_worker_mirrored", 2)
    assert keras_mwm.spec.experiment()["global_batch_size"] == mwm.spec.experiment()["global_batch_size"] == 32
    assert (mwm.spec.baseline, mwm.spec.keras_baseline) == ("multi_worker_mirrored_1", keras_mwm.spec.name)
    assert [n for n, r in rows.items() if r.spec.keras_baseline] == ["multi_worker_mirrored_2"]
    jobs = jobs_for(list(rows.values()), repeats=2)
    for repeat, step in ((0, 1), (1, -1)):  # odd repeats backwards: the pair stays side by side
        order = [j.rows[0].name for j in jobs if j.repeat == repeat]
        for keras, row in (("keras_fit", "tfdist_fit"), ("keras_fit_mirrored_2", "tfdist_fit_mirrored_2"),
                           (keras_mwm.spec.name, mwm.spec.name)):
            assert order.index(row) == order.index(keras) + step
    assert {j.rows[0].name: j.processes for j in jobs}[keras_mwm.spec.name] == 2
    # --only: a row brings the rows of its ratios (its own baseline, and Keras under its strategy).
    assert [r.spec.name for r in plan(steps=8, warmup=4, only=["multi_worker_mirrored_2"]).rows] == [
        "keras_fit", "multi_worker_mirrored_1", keras_mwm.spec.name, mwm.spec.name]
    assert [r.spec.name for r in plan(steps=8, warmup=4, only=["tfdist_fit_mirrored_2"]).rows] == [
        "keras_fit", "keras_fit_mirrored_2", "tfdist_fit_mirrored_2"]


def test_the_small_models_have_every_mode_beside_the_row_it_is_compared_to_on_the_same_experiment():
    rows = {r.spec.name: r for r in bench.rows_for(8, 4)}
    for model, batch, factor in (("dense", 64, 50), ("conv", 32, 8)):
        mine = {n: r for n, r in rows.items() if n.endswith(f"_{model}")}
        pairs = {f"tfdist_fit_{model}": f"keras_fit_{model}",
                 f"keras_fit_mirrored_2_{model}": f"keras_fit_{model}",
                 f"tfdist_fit_mirrored_2_{model}": f"keras_fit_mirrored_2_{model}",
                 f"keras_fit_setup_mirrored_2_{model}": f"keras_fit_mirrored_2_{model}",
                 f"keras_fit_setup_multi_worker_mirrored_2_{model}": f"keras_fit_{model}",
                 f"tfdist_fit_multi_worker_mirrored_2_{model}": f"keras_fit_setup_multi_worker_mirrored_2_{model}"}
        assert set(mine) == {f"keras_fit_{model}", *pairs}
        assert {n: r.spec.baseline for n, r in mine.items() if r.spec.baseline} == pairs
        for row in mine.values():  # both sides time their second epoch whole, on the model's arrays
            spec = row.spec
            assert (spec.steps, spec.warmup, spec.epochs) == (8 * factor, 4 * factor, 2)
            assert spec.experiment()["model"] == model
            assert spec.experiment()["global_batch_size"] == batch * row.processes == batch * spec.workers
            assert spec.experiment().get("setup", False) == ("setup" in spec.name)
        assert rows[f"tfdist_fit_mirrored_2_{model}"].spec.strategy == "mirrored"
        assert rows[f"tfdist_fit_mirrored_2_{model}"].spec.experiment()["cpu_devices"] == 2
    jobs = jobs_for(list(rows.values()), repeats=1)
    order = [j.rows[0].name for j in jobs]
    for row, baseline in (("tfdist_fit_dense", "keras_fit_dense"), ("tfdist_fit_mirrored_2_conv",
                                                                     "keras_fit_mirrored_2_conv")):
        assert order.index(row) == order.index(baseline) + 1


def test_a_row_with_its_own_baseline_and_keras_under_its_strategy_has_both_ratios_paired_by_repeat():
    planned = plan(steps=8, warmup=4, only=["multi_worker_mirrored_2", "tfdist_fit"])
    ips = {"keras_fit": (100, 200), "tfdist_fit": (98, 180), "multi_worker_mirrored_1": (90, 100),
           "keras_fit_multi_worker_mirrored_2": (50, 80), "multi_worker_mirrored_2": (60, 64)}
    measured = {name: [Measured(name=name, repeat=i, images_per_second=float(v)) for i, v in enumerate(values)]
                for name, values in ips.items()}
    out = json.loads(json.dumps(results(planned, measured, {})))
    rows = {r["name"]: r for r in out["rows"]}
    two = rows["multi_worker_mirrored_2"]
    assert two["ratio_to_baseline"]["to"] == "multi_worker_mirrored_1"
    assert two["ratio_to_baseline"]["runs"] == pytest.approx([60 / 90, 0.64])
    assert two["ratio_to_keras"]["to"] == "keras_fit_multi_worker_mirrored_2"
    assert two["ratio_to_keras"]["runs"] == pytest.approx([1.2, 0.8])
    assert out["workers"]["multi_worker_mirrored"][1]["speedup"] == pytest.approx((60 / 90 + 0.64) / 2)
    assert rows["tfdist_fit"]["ratio"]["runs"] == pytest.approx([0.98, 0.9]) and "ratio_to_keras" not in rows["tfdist_fit"]
    goal = {g["goal"]: g for g in out["goals"]}["tfdist_fit >= 0.97x keras_fit"]
    assert goal["value"] == pytest.approx(0.94) and goal["met"] is False and goal["max"] == pytest.approx(0.98)
    table = bench.markdown(out)
    assert ("| 0.65 (0.64-0.67) to multi_worker_mirrored_1; 1.00 (0.80-1.20) to keras_fit_multi_worker_mirrored_2 |"
            in table)
    assert "| tfdist_fit >= 0.97x keras_fit | 0.940 |" in table
    assert "one_device >= 1.00x keras_fit" not in table  # a goal whose rows did not run is left out


def test_the_cpu_time_ratio_is_paired_by_repeat_beside_the_wall_clocks_and_met_reads_the_wall_clock():
    planned = plan(steps=8, warmup=4, only=["tfdist_fit_mirrored_2", "keras_fit_mirrored_2"])
    # (images/s, CPU seconds per step of 16 images) per repeat: the wall clock and the CPU time disagree.
    runs = {"keras_fit": ((100, 0.2), (200, 0.1)), "keras_fit_mirrored_2": ((50, 0.4), (90, 0.2)),
            "tfdist_fit_mirrored_2": ((45, 0.32), (99, 0.25))}
    measured = {name: [Measured(name=name, repeat=i, images_per_second=float(ips), cpu_seconds_per_step=cpu,
                                global_batch_size=16) for i, (ips, cpu) in enumerate(values)]
                for name, values in runs.items()}
    out = json.loads(json.dumps(results(planned, measured, {})))
    row = {r["name"]: r for r in out["rows"]}["tfdist_fit_mirrored_2"]
    assert row["ratio_to_baseline"]["runs"] == pytest.approx([0.9, 1.1])
    assert row["ratio_to_baseline"]["cpu"]["runs"] == pytest.approx([1.25, 0.8])  # 0.4 / 0.32, 0.2 / 0.25
    goal = {g["goal"]: g for g in out["goals"]}["tfdist_fit_mirrored_2 >= 1.00x keras_fit_mirrored_2"]
    assert goal["value"] == pytest.approx(1.0) and goal["met"] is True
    assert goal["cpu"] == pytest.approx({"median": 1.025, "min": 0.8, "max": 1.25})
    table = bench.markdown(out)
    assert "| tfdist_fit_mirrored_2 >= 1.00x keras_fit_mirrored_2 | 1.000 | 0.900 | 1.100 | yes | 1.02 (0.80-1.25) |" \
        in table
    assert "1.00 (0.90-1.10) (CPU time 1.02 (0.80-1.25)) to keras_fit_mirrored_2" in table
    # Results without CPU times (written before the rows measured them) keep their columns.
    for rows in measured.values():
        rows[:] = [dataclasses.replace(m, cpu_seconds_per_step=None) for m in rows]
    assert "CPU time" not in bench.markdown(json.loads(json.dumps(results(planned, measured, {}))))


def test_scaling_with_workers_is_measured_speedup_over_one_worker_in_the_same_repeat():
    planned = plan(steps=8, warmup=4, only=["parameter_server_2", "parameter_server_4"])
    measured = {"keras_fit": [Measured(name="keras_fit", repeat=i, images_per_second=100.0) for i in range(2)]}
    for n, ips in ((1, (50.0, 40.0)), (2, (80.0, 80.0)), (4, (100.0, 120.0))):
        measured[f"parameter_server_{n}"] = [Measured(name=f"parameter_server_{n}", repeat=i, images_per_second=v)
                                             for i, v in enumerate(ips)]
    workers = results(planned, measured, {})["workers"]["parameter_server"]
    assert [w["workers"] for w in workers] == [1, 2, 4]
    assert workers[1]["speedup_spread"]["runs"] == pytest.approx([1.6, 2.0])
    assert workers[2]["speedup"] == pytest.approx(2.5) and workers[2]["efficiency"] == pytest.approx(2.5 / 4)


def test_the_window_is_from_the_first_chunk_end_after_the_warm_up_to_the_end_of_the_last_step_on_both_clocks():
    from tfdist.bench.measure import window

    clock = [(1, 10.0, 1.0), (2, 10.5, 1.25), (4, 11.0, 1.5), (8, 13.0, 2.75)]
    assert window(clock, 4, 8) == (4, 2.0, 1.25)
    assert window(clock, 3, 8) == (4, 2.0, 1.25)  # a grown chunk ended no step at 3: the window starts at 4
    with pytest.raises(RuntimeError, match=r"a step ended in \[5, 8\) and the end of step 8"):
        window(clock, 5, 8)


def test_a_clusters_memory_and_cpu_time_are_the_sums_of_its_processes_and_its_figures_worker_0s():
    job = Job(rows=(), processes=2, repeat=1)
    per_process = [[Measured(name="r", images_per_second=10.0, cpu_seconds_per_step=0.25, peak_rss_mb=700.0)],
                   [Measured(name="r", images_per_second=11.0, cpu_seconds_per_step=0.5, peak_rss_mb=650.0)]]
    assert children.combine(job, per_process) == [Measured(name="r", repeat=1, images_per_second=10.0,
                                                           cpu_seconds_per_step=0.75, peak_rss_mb=1350.0,
                                                           processes=2)]


def test_docs_benchmarks_md_is_what_its_committed_json_renders():
    from pathlib import Path

    page = Path(REPO) / "docs" / "benchmarks.md"
    text = page.read_text()
    assert text.count("<!-- bench: ") >= 2  # the full and the quick run's tables
    assert bench.render_docs(page, root=Path(REPO)) == text, "run: python -m tfdist.bench --render docs/benchmarks.md"


def test_unknown_rows_are_refused_by_name():
    from tfdist.errors import UserError

    with pytest.raises(UserError, match=r"--only.*Received: one_devise.*Expected names among: keras_fit"):
        bench.run_benchmark(quick=True, only=["one_devise"])
    with pytest.raises(UserError, match="without `--time_to_accuracy`"):
        plan(steps=8, warmup=2, only=["accuracy_one_device"])


#: (case, flags, the start of the one line): each is refused before anything is measured or written.
BAD_FLAGS = [
    ("steps_negative", ["--steps=-1"], "error: invalid command line: flag --steps=-1: -1 is not a non-negative"),
    ("repeats_negative", ["--repeats=-2"], "error: invalid command line: flag --repeats=-2: -2 is not a non-negative"),
    ("output_a_directory", ["--output={d}"], "error: Invalid value for `--output`. Received: '{d}', an existing directory."),
    ("markdown_a_directory", ["--output={d}/b.json", "--markdown={d}"], "error: Invalid value for `--markdown`."),
    ("chart_under_a_file", ["--output={d}/b.json", "--chart={d}/page.md/c.png"],
     "error: Invalid value for `--chart`. Received: '{d}/page.md/c.png', under {d}/page.md, which is a file."),
    ("default_markdown_a_directory", ["--output={d}/sub.json"], "error: Invalid value for `--markdown`. Received: '{d}/sub.md'"),
    ("render_not_utf8", ["--render={d}/latin1.md"], "error: Cannot render `--render` page {d}/latin1.md: UnicodeDecodeError"),
    ("render_a_missing_json", ["--render={d}/page.md"], "error: Cannot render `--render` page {d}/page.md: FileNotFoundError"),
    ("render_a_list", ["--render={d}/list.md"],
     "error: Cannot render `--render` page {d}/list.md: ValueError: list.json holds [], not the results of tfdist.bench"),
    ("render_an_empty_object", ["--render={d}/object.md"],
     "error: Cannot render `--render` page {d}/object.md: ValueError: object.json holds {{}}, not the results of "
     "tfdist.bench"),
    ("child_not_json", ["--child={{bad"], "error: Invalid value for `--child` (internal: the benchmark's own rows)."),
]


@pytest.mark.parametrize("case, flags, expected", BAD_FLAGS, ids=[c for c, _, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line_and_status_2_before_anything_runs(tmp_path, case, flags, expected):
    (tmp_path / "sub.md").mkdir()
    (tmp_path / "latin1.md").write_bytes(b"caf\xe9\n")
    (tmp_path / "page.md").write_text("<!-- bench: nope.json -->\nold\n<!-- /bench -->\n")
    for name, value in (("list", "[]"), ("object", "{}")):
        (tmp_path / f"{name}.json").write_text(value)
        (tmp_path / f"{name}.md").write_text(f"<!-- bench: {name}.json -->\nold\n<!-- /bench -->\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli("tfdist.bench", "--quick", "--only=one_device", *(f.format(d=tmp_path) for f in flags),
                     timeout=120, cwd=tmp_path)
    assert_user_error(result, "^" + re.escape(expected.format(d=tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _python(code: str):
    return children._start(python_argv(code), env={})


def test_children_that_write_much_to_stderr_do_not_block():
    # 256 KB on stderr from each of two children: more than a pipe holds while the other is waited on.
    code = "import sys; sys.stderr.write('x' * (1 << 18)); print('BENCH {\"name\": \"child%d\"}')"
    results_ = children._collect([_python(code % 0), _python(code % 1)], timeout=60)
    assert results_ == [[Measured(name="child0")], [Measured(name="child1")]]


def test_a_failed_child_ends_its_peers_at_once():
    import time

    peer = _python("import time; time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"benchmark child failed \(3\): boom"):
        children._collect([peer, _python("import sys; sys.stderr.write('boom'); sys.exit(3)")], timeout=120)
    assert time.monotonic() - started < 30  # the peer was killed, not waited for (it sleeps 60 s)


#: A stand-in for TensorFlow's ``profiler_v2.py`` whose ``stop`` aborts the process (as TF 2.21's can, see
#: ``children``) the first ``times`` times it is called, in worker 1 of a cluster (as TF's did) or in the
#: one process outside one; ``elsewhere`` aborts the same way in a function of another name.
FAKE_PROFILER = """
import json, os

def crashes(marker, times):
    if json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 1}}'))["task"]["index"] != 1:
        return False
    for i in range(times):
        if not os.path.exists(f"{marker}.{i}"):
            open(f"{marker}.{i}", "w").close()
            return True
    return False

def stop(marker, times):
    if crashes(marker, times):
        os.abort()

def elsewhere(marker, times):
    if crashes(marker, times):
        os.abort()
"""


def _profiler_cluster(tmp_path, function: str, times: int, processes: int, attempts: int = 5):
    (tmp_path / "profiler_v2.py").write_text(FAKE_PROFILER)
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import profiler_v2; "
            f"profiler_v2.{function}({str(tmp_path / 'crash')!r}, {times}); "
            "print('BENCH {\"name\": \"ok\"}')")
    logs = []
    ran = children.run_cluster(lambda: python_argv(code), processes, timeout=60, attempts=attempts,
                               log=logs.append)
    return ran, logs


def test_a_cluster_whose_child_died_in_the_profilers_stop_runs_again(tmp_path):
    ran, logs = _profiler_cluster(tmp_path, "stop", times=2, processes=2)  # worker 1 crashes in runs 1 and 2
    assert ran == [[Measured(name="ok")], [Measured(name="ok")]]
    assert logs == [f"bench: benchmark child died in TensorFlow's profiler ({-6}); running it again ({n} of at most 5)"
                    for n in (2, 3)]


def test_the_profilers_crash_is_run_again_at_most_attempts_times(tmp_path):
    with pytest.raises(children.ProfilerCrashed, match="died in TensorFlow's profiler"):
        _profiler_cluster(tmp_path, "stop", times=3, processes=1, attempts=3)
    assert len(list(tmp_path.glob("crash.*"))) == 3  # three runs, each crashed


def test_any_other_crash_fails_at_once(tmp_path):
    with pytest.raises(RuntimeError, match=r"benchmark child failed \(-6\)") as raised:
        _profiler_cluster(tmp_path, "elsewhere", times=1, processes=1)
    assert not isinstance(raised.value, children.ProfilerCrashed)
    assert "in elsewhere" in str(raised.value)  # the child's Python stack (faulthandler) is in the message


def test_a_child_job_and_its_results_cross_the_process_boundary_unchanged():
    from tfdist.bench.rows import ChildJob

    job = ChildJob(rows=tuple(r.spec for r in bench.rows_for(4, 2)), spawned_at=12.5)
    assert ChildJob.from_json(job.to_json()) == job
    measured = Measured(name="allreduce_2", repeat=1, details={"sweep": [{"bytes": 65536, "seconds": 0.001}]})
    assert measured.to_line().startswith("BENCH ") and Measured.from_line(measured.to_line()) == measured
    assert "cached_images_per_second" not in measured.to_dict()  # not measured: not in the JSON


def test_the_step_reached_is_one_step_of_every_task_or_the_measurement_fails():
    from tfdist.bench.preemption import PreemptionSpec, _reached_step

    two = PreemptionSpec(name="p", strategy="multi_worker_mirrored", workers=2)
    line = "[worker:{}] error: Preempted at step {} of 24: worker:1 received SIGTERM. Saved ..."
    assert _reached_step("\n".join([line.format(0, 9), "[launch] exit status 42", line.format(1, 9)]), two) == 9
    for text in (line.format(0, 9), "\n".join([line.format(0, 9), line.format(1, 10)])):
        with pytest.raises(RuntimeError, match="expected 2 `error: Preempted at step N` line"):
            _reached_step(text, two)


def test_a_runs_rows_skip_the_line_being_written_and_other_splits(tmp_path):
    from tfdist.bench.children import rows

    metrics = tmp_path / "metrics.jsonl"
    assert rows(metrics, "eval") == []  # not written yet
    metrics.write_text('{"split": "train", "step": 1}\n{"split": "eval", "step": 1, "mean_iou": 0.5}\n{"split": "tr')
    assert rows(metrics, "eval") == [{"split": "eval", "step": 1, "mean_iou": 0.5}]
    assert rows(metrics, "train") == [{"split": "train", "step": 1}]
