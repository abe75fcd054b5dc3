"""The differential check's space, verdicts and CLI without TensorFlow: what it draws, how it classifies."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest

from helpers.clis import REPO, assert_user_error, run_cli
from tfdist.check import groups, runs, space, verdict
from tfdist.check.cli import BEGIN, END, cells, fresh_lines, page_block, render, run_command

DRAWS = [space.draw(seed) for seed in space.seeds(600, 0)]


def test_a_seed_draws_the_same_case_and_a_run_seed_the_same_cases():
    assert space.seeds(5, 3) == space.seeds(5, 3) != space.seeds(5, 4)
    assert [space.draw(s) for s in space.seeds(5, 3)] == [space.draw(s) for s in space.seeds(5, 3)]
    assert len({space.draw(s) for s in space.seeds(50, 0)}) == 50


def test_the_draws_cover_every_choice_of_the_space():
    seen = collections.defaultdict(set)
    for case in DRAWS:
        for family, values in case.families().items():
            seen[family] |= set(values)
    assert seen["model"] == set(space.MODELS) | set(space.UNSUPERVISED)
    assert seen["optimizer"] == set(space.OPTIMIZERS)
    assert seen["clip"] == set(space.CLIPS)
    assert seen["callback"] == set(space.CALLBACKS) | set(space.WATCHERS)
    assert seen["metric"] == {name for table in space.METRICS.values() for name, _ in table}
    assert {"divides", "last batch splits evenly", "last batch splits unevenly", "Dataset", "numpy",
            "sample_weight", "class_weight", "PyDataset", "generator", "x alone", "shuffle=True", "initial_epoch=1",
            "resumed by BackupAndRestore"} <= seen["input"]
    assert set(space.UNSUPERVISED) <= seen["model"]
    assert {"validation_data", "validation_split", "validation_freq=2"} <= seen["validation"]
    assert {"steps_per_execution=2", "jit_compile=True", "mixed_float16"} <= seen["compile"]
    assert {"use_ema=True", "gradient_accumulation_steps=2", "LearningRateSchedule", "LossScaleOptimizer",
            "momentum=0.9", "nesterov=True", "centered=True", "weight_decay=0.05", "ema_overwrite_frequency=3"} <= seen["option"]


def test_clip_thresholds_span_clipping_every_step_to_never():
    thresholds = [case.clip[1] for case in DRAWS if case.clip]
    assert min(thresholds) < 0.01 and max(thresholds) > 3 and len(thresholds) > 100


def test_every_draw_is_a_setup_keras_accepts():
    for case in DRAWS:
        assert not (case.dataset and (case.sample_weight or case.class_weight or case.validation == "split"))
        assert not (case.schedule and case.callback in ("ReduceLROnPlateau", "LearningRateScheduler",
                                                          "SetLearningRate"))
        assert not (case.sample_weight and case.class_weight)
        assert case.rows >= 2 * case.batch and (case.validation_freq == 1 or case.validation)
        if case.source != "numpy" or case.dataset:  # Keras takes these with arrays alone
            assert not (case.sample_weight or case.validation == "split")
        if case.source == "generator" or case.dataset:
            assert not case.shuffle  # Keras shuffles neither (it is drawn where it means something)
        assert not (case.source == "generator" and case.class_weight)
        if case.x_alone:
            assert not (case.metrics or case.sample_weight or case.class_weight or case.validation)
            assert case.source == "numpy" and not case.mixed_precision and not case.loss_scale
        assert not case.resumed or (case.watcher == "BackupAndRestore" and not case.initial_epoch)
        # Keras saves or backs up no model that was never called: a GAN without call() is never built.
        assert not (case.model == "gan" and case.watcher in ("ModelCheckpoint", "BackupAndRestore"))


def _result(loss=(1.0, 0.5), weight=1.0, iterations=4, **extra):
    return {"history": {"loss": list(loss)}, "weights": [np.full((2, 2), weight)], "learning_rate": 0.01,
            "iterations": iterations, "copies": 0.0, "evaluate": {"loss": 0.4}, "predict": [np.ones(3)], **extra}


def test_a_result_within_the_tolerance_is_equal_and_one_beyond_it_differs_naming_the_part():
    want = _result()
    assert verdict.verdict(_result(loss=(1.0, 0.5 + 1e-7)), want, tol=1e-6)["class"] == "equal"
    found = verdict.verdict(_result(loss=(1.0, 0.5001)), want, tol=1e-6)
    assert found["class"] == "differs" and found["detail"].startswith("history") and "(loss)" in found["detail"]
    assert verdict.verdict(_result(weight=1.001), want, tol=1e-6)["detail"].startswith("weights")
    assert verdict.verdict(_result(iterations=5), want, tol=1e-6)["detail"].startswith("optimizer")
    missing = verdict.verdict({**_result(), "history": {}}, want, tol=1e-6)
    assert missing["class"] == "differs" and "loss (missing" in missing["detail"]
    shorter = verdict.verdict(_result(loss=(1.0,)), want, tol=1e-6)
    assert shorter["class"] == "differs"


def _written(directory, event_files=1, loss="0.5"):
    (directory / "tensorboard" / "train").mkdir(parents=True)
    for i in range(event_files):
        (directory / "tensorboard" / "train" / f"events.out.tfevents.{i}.host{i}.v2").write_bytes(b"x")
    (directory / "best.keras").write_bytes(b"zip")
    (directory / "log.csv").write_text(f"epoch,loss\n0,1.0\n1,{loss}\n")
    return runs.files(str(directory))


def test_the_files_callbacks_wrote_are_equal_only_as_one_device_wrote_them(tmp_path):
    want = _written(tmp_path / "one")
    assert want["tensorboard/train/events.out.tfevents.*"] == 1
    assert want["log.csv"] == {"columns": ["epoch", "loss"], "rows": [[0.0, 1.0], [1.0, 0.5]]}
    close = verdict.verdict(_result(files=_written(tmp_path / "close", loss="0.5000001")), _result(files=want),
                            tol=1e-6)
    assert close["class"] == "equal"
    twice = verdict.verdict(_result(files=_written(tmp_path / "twice", event_files=2)), _result(files=want),
                            tol=1e-6)
    assert twice["class"] == "differs" and twice["detail"].startswith("files") and "2 written vs 1" in twice["detail"]
    off = verdict.verdict(_result(files=_written(tmp_path / "off", loss="0.6")), _result(files=want), tol=1e-6)
    assert off["class"] == "differs" and "log.csv" in off["detail"]
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "stray.keras").write_bytes(b"zip")
    extra = {**_written(tmp_path / "more" / "run"), **runs.files(str(tmp_path / "more"))}
    assert verdict.verdict(_result(files=extra), _result(files=want), tol=1e-6)["class"] == "differs"


def test_refusals_and_crashes_keep_their_line_and_an_asynchronous_mode_needs_only_to_train():
    want = _result()
    assert verdict.verdict({"refused": "Invalid x"}, want, tol=1e-6) == {"class": "refused", "detail": "Invalid x"}
    assert verdict.verdict({"crashed": "E: y"}, want, tol=1e-6)["class"] == "crashed"
    assert verdict.verdict(_result(loss=(0.9, 0.7)), want, tol=1e-6, asynchronous=True)["class"] == "trained"
    assert verdict.verdict(_result(loss=(0.9, math.nan)), want, tol=1e-6, asynchronous=True)["class"] == "differs"


def test_the_tolerance_lies_a_factor_above_the_measured_noise_floor_and_never_below_the_minimum():
    assert verdict.tolerance(0.0) == verdict.MINIMUM
    assert verdict.tolerance(2e-7) == pytest.approx(verdict.FLOOR_FACTOR * 2e-7)
    assert verdict.noise_floor(_result(loss=(1.0, 0.5 + 5e-8)), _result()) == pytest.approx(1e-7)


def test_the_matrix_has_a_row_per_family_value_and_the_classes_of_its_cases_per_mode():
    cases = {c.seed: c for c in DRAWS[:3]}
    records = [{"seed": seed, "mode": "mirrored", "class": "equal"} for seed in cases]
    records.append({"seed": DRAWS[0].seed, "mode": "keras_mirrored", "class": "refused"})
    table = render(cells(cases, records), ["mirrored", "keras_mirrored"])
    row = next(line for line in table.splitlines() if line.startswith(f"| model | {DRAWS[0].model} |"))
    assert row.split(" | ")[3].startswith("1 refused")
    models = collections.Counter(c.model for c in cases.values())
    assert f"{models[DRAWS[0].model]} equal" in row


@pytest.mark.parametrize("args, match", [
    (("--modes", "mirrored,nope"), "Invalid value for `--modes`"),
    (("--case", "12,x"), "Invalid value for `--case`"),
    (("--cases", "0"), "--cases"),
    (("extra",), "Unexpected arguments"),
    (("--output", "/nonexistent/dir/out.json"), "Invalid value for `--output`"),
    (("--markdown", "docs"), "Invalid value for `--markdown`"),
    (("--page", "README.md"), "Invalid value for `--page`"),
])
def test_bad_input_is_one_line_and_status_2(args, match):
    assert match in assert_user_error(run_cli("tfdist.check", *args, timeout=60))


@pytest.mark.parametrize("model, match", [
    ("no_colon", "Expected MODULE:FUNCTION"),
    ("tfdist_no_such_module:setup", "cannot be imported"),
    ("/nonexistent/model.py:setup", "/nonexistent/model.py is not there"),
    ("tfdist.check.space:no_such_function", "has no function 'no_such_function'"),
])
def test_a_model_that_cannot_be_found_is_one_line_before_any_process_starts(model, match):
    assert match in assert_user_error(run_cli("tfdist.check", "--model", model, timeout=60))


def test_docs_fit_shows_the_matrix_of_the_committed_run_by_its_command():
    report = json.loads((REPO / "docs" / "check-matrix.json").read_text())
    text = (REPO / "docs" / "fit.md").read_text()
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")
    assert block == page_block(report)
    assert report["command"].startswith("python -m tfdist.check") and report["cases"] >= 20
    families = {row[0] for row in report["cells"]}
    assert families == set(space.FAMILIES), families


def test_a_matrix_records_the_command_that_repeats_its_run_without_where_results_went():
    argv = ["--cases", "40", "--seed=11", "--output", "/tmp/a.json", "--matrix=docs/m.json", "--page", "docs/fit.md"]
    assert run_command(argv) == "python -m tfdist.check --cases 40 --seed=11"


def _report(directory, task, records, running=None, **extra):
    report = {"task": task, "group": "workers", "noise_floor": 0.0, "tolerance": 1e-6, "after_crash": None,
              "mixed_float16": {"noise_floor": 0.0, "tolerance": 1e-6}, "records": records, "running": running,
              **extra}
    (directory / f"workers-0-{task}.json").write_text(json.dumps(report))


def _record(seed, mode, kind="equal", detail=""):
    return {"seed": seed, "mode": mode, "class": kind, "detail": detail}


def test_after_a_crash_a_group_restarts_with_the_pairs_after_it_and_a_peer_killed_there_crashed_with_it(tmp_path):
    # worker-1 crashed on the second pair; worker-0 had its verdict of the first and was stopped in the second.
    work = [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
    (tmp_path / "workers-0.log").write_text("[worker:0] last words\n")
    _report(tmp_path, "worker-0", [_record(1, "a")], running=[1, "b"])
    _report(tmp_path, "worker-1", [_record(1, "a"), _record(1, "b", "crashed", "CollectiveFailed: x")],
            stopped="crashed")
    found, left, after = groups.collect(groups.Group("workers", work), tmp_path, None)
    assert left == work[2:] and after == {"seed": 1, "mode": "b"}
    by_task = {r["task"]: r["records"] for r in found}
    assert by_task["worker-0"][-1] == {**_record(1, "b", "crashed"),
                                       "detail": "ended with its cluster when worker-1 crashed: CollectiveFailed: x"}
    assert [r["class"] for r in by_task["worker-1"]] == ["equal", "crashed"]


def test_a_verdict_a_peer_gave_past_the_crash_is_dropped_and_a_group_that_ran_nothing_is_unfinished(tmp_path):
    work = [(1, "a"), (2, "a"), (3, "a")]
    (tmp_path / "workers-0.log").write_text("")
    _report(tmp_path, "worker-0", [_record(1, "a", "crashed", "E: y")], stopped="crashed")
    _report(tmp_path, "worker-1", [_record(1, "a"), _record(2, "a")], running=[3, "a"])
    found, left, after = groups.collect(groups.Group("workers", work), tmp_path, None)
    assert left == work[1:] and after == {"seed": 1, "mode": "a"}
    assert [r["seed"] for r in found[1]["records"]] == [1]  # its verdict of case 2 runs again in fresh processes
    for path in tmp_path.glob("workers-0-*.json"):
        path.unlink()
    (tmp_path / "workers-0.log").write_text("Traceback\nImportError: no\n")
    found, left, after = groups.collect(groups.Group("workers", work), tmp_path, None)
    assert (left, after) == ([], None) and "ImportError" in found[-1]["unfinished"]


def test_a_group_stopped_at_the_timeout_reports_a_timeout_and_the_verdicts_it_did_not_run(tmp_path):
    work = [(1, "a"), (2, "a"), (3, "a")]
    (tmp_path / "workers-0.log").write_text("")
    _report(tmp_path, "worker-0", [_record(1, "a")], running=[2, "a"])
    _report(tmp_path, "worker-1", [_record(1, "a")], running=[2, "a"])
    found, left, after = groups.collect(groups.Group("workers", work, after_crash={"seed": 0, "mode": "a"}),
                                        tmp_path, 30.0)
    assert after is None and left == [(3, "a")]
    timeouts = [r for report in found for r in report["records"] if r["class"] == "timeout"]
    assert len(timeouts) == 2 and "--timeout 30 s" in timeouts[0]["detail"]
    assert timeouts[0]["after_crash"] == {"seed": 0, "mode": "a"}
    assert found[-1]["not_run"] == [(3, "a")]
    assert verdict.verdict({"crashed": "E: y"}, _result(), tol=1e-6)["class"] in verdict.FAILING
    assert "timeout" in verdict.FAILING and "timeout" in verdict.CLASSES


def test_the_report_names_the_verdicts_that_ran_in_fresh_processes_after_each_crash():
    crash = {"seed": 5, "mode": "keras_mirrored"}
    records = [{**_record(5, "keras_mirrored", "crashed"), "task": "local"},
               {**_record(6, "mirrored"), "task": "local", "after_crash": crash},
               {**_record(6, "keras_mirrored"), "task": "local", "after_crash": crash}]
    assert fresh_lines(records) == ["restarted after case 5 crashed in keras_mirrored: 2 verdicts of its processes "
                                    "ran in fresh ones (case 6 in mirrored, case 6 in keras_mirrored)"]
