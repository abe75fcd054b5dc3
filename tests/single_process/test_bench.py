"""The benchmark's real runs in one process: a small benchmark, the profiles, time to accuracy, a preemption."""

import json

import pytest

from helpers.clis import run_cli, run_python


def test_a_small_benchmark_writes_json_markdown_and_chart_with_versions_and_machine(tmp_path):
    out = tmp_path / "b.json"
    result = run_cli("tfdist.bench", "--only=one_device,tfdist_fit_dense", "--steps=3", "--repeats=1", "--noscaling",
                     f"--output={out}", timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["name"] for r in data["rows"]] == ["keras_fit", "one_device", "keras_fit_dense", "tfdist_fit_dense"]
    assert set(data["versions"]) == {"python", "tensorflow", "keras", "tfdist"}
    assert data["versions"]["tensorflow"].startswith("2.") and data["machine"]["cpus"] > 0
    assert data["machine"]["cpu_model"] and data["machine"]["wall_seconds"] > 0
    keras_fit, one_device, keras_dense, fit_dense = data["rows"]
    for row in data["rows"]:  # each row's figures are its own process's: a fresh one per run
        rec = row["record"]
        assert rec["processes"] == 1 and rec["peak_rss_mb"] > 300 and rec["cpu_seconds_per_step"] > 0
    assert keras_fit["record"]["seconds_to_first_step"] > 1 < one_device["record"]["seconds_to_first_step"]
    # The small model's rows: each side's second epoch timed whole, tfdist.fit's ratio paired with Keras' fit.
    dense = fit_dense["record"]["images_per_second"] / keras_dense["record"]["images_per_second"]
    assert fit_dense["ratio_to_baseline"]["to"] == "keras_fit_dense"
    assert fit_dense["ratio_to_baseline"]["runs"] == [pytest.approx(dense, rel=1e-12)]
    # The same pair on the process's CPU time: images per CPU-second, over Keras' fit's.
    cpu = keras_dense["record"]["cpu_seconds_per_step"] / fit_dense["record"]["cpu_seconds_per_step"]
    assert fit_dense["ratio_to_baseline"]["cpu"]["runs"] == [pytest.approx(cpu, rel=1e-12)]
    ips = one_device["record"]["images_per_second"] / keras_fit["record"]["images_per_second"]
    assert one_device["ratio"]["runs"] == [pytest.approx(ips, rel=1e-12)]
    table = out.with_suffix(".md").read_text()
    assert f"| one_device | {one_device['images_per_second']['median']:.1f} | {ips:.2f} |" in table
    assert "TensorFlow " + data["versions"]["tensorflow"] in table
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_the_train_step_profile_runs_and_prints_each_step_against_keras():
    result = run_python(["examples/profile_train_step.py", "--blocks=3", "--steps=1"], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [line[0].rstrip(":") for line in lines] == ["tfdist", "tfdist_no_stats", "keras"]
    assert all(float(line[1]) > 0 for line in lines) and lines[-1][3] == "(1.000x"


def test_the_fit_profile_times_both_fits_in_one_process_on_both_clocks():
    result = run_cli("tfdist.bench.fit_profile", "--rounds=2", "--steps=2", timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert [line.split(": ")[1] for line in lines[:4]] == ["keras_fit", "tfdist_fit", "tfdist_fit", "keras_fit"]
    assert all(float(line.split()[3]) > 0 and float(line.split()[6]) > 0 for line in lines[:4])
    assert [line.split(", paired")[0] for line in lines[4:]] == [
        "tfdist_fit / keras_fit speed, wall time", "tfdist_fit / keras_fit speed, CPU time"]


#: The small runs' experiment: the benchmark's, with a tiny model and batch (a start costs ~10-15 s here).
TINY = {"train_examples": 64, "eval_examples": 16, "base_filters": 4, "depth": 2, "global_batch_size": 8}


def test_time_to_accuracy_stops_a_real_run_at_its_first_eval_past_the_target():
    from tfdist.bench.accuracy import AccuracySpec, measure

    flags = tuple(f"--{k}={v}" for k, v in {**TINY, "epochs": 6, "steps_per_epoch": 2}.items())
    row = measure(AccuracySpec(name="a", strategy="one_device", flags=flags, target=0.0, timeout=180))
    assert row["reached"] and row["step"] == 2 and row["status"] == 42  # stopped after epoch 1 of 6
    assert row["seconds_to_target"] == row["evals"][0][0] > 1


def test_a_preemption_of_one_device_ends_42_and_resumes_at_the_step_it_reached():
    from tfdist.bench.preemption import PreemptionSpec, measure

    spec = PreemptionSpec(name="preemption_one_device", strategy="one_device", steps=16, signal_at=4,
                          overrides=TINY, timeout=120)
    m = measure(spec)
    assert m.statuses == (42, 0)
    # Held after step 4 until the signal, the run stops after the next step, however fast it trains.
    assert m.reached_step == 5 and m.resumed_step == 5
    assert m.exit_seconds > 0 and m.fresh_first_step_seconds > 0 and m.resumed_first_step_seconds > 0
    assert m.resume_ratio == m.resumed_first_step_seconds / m.fresh_first_step_seconds

