"""The benchmark's rows across two workers, measured in real children and paired by repeat."""

import dataclasses

import pytest


from tfdist import bench
from tfdist.bench import children
from tfdist.bench.plan import Plan
from tfdist.bench.report import results
from tfdist.bench.rows import Job


def test_tfdist_fit_and_keras_fit_across_two_workers_measure_in_real_children_and_pair():
    small = {"base_filters": 4, "depth": 2}
    rows = {r.spec.name: r for r in bench.rows_for(2, 2)}
    specs = {name: dataclasses.replace(row.spec, overrides={**row.spec.overrides, **small})
             for name, row in rows.items()}
    jobs = [  # the pair on one device shares a process here (a row's own process in the bench)
        Job(rows=(specs["keras_fit"], specs["tfdist_fit"])),
        Job(rows=(specs["keras_fit_multi_worker_mirrored_2"],), processes=2),
        Job(rows=(specs["multi_worker_mirrored_2"],), processes=2),
    ]
    measured = {m.name: [m] for job in jobs for m in children.launch(job, log=lambda _: None)}
    for name, (m,) in measured.items():
        assert m.images_per_second > 0 and m.row_seconds > 0, name
    assert measured["tfdist_fit"][0].num_replicas == 1
    keras_mwm = measured["keras_fit_multi_worker_mirrored_2"][0]
    assert (keras_mwm.num_replicas, keras_mwm.global_batch_size, keras_mwm.processes) == (2, 32, 2)
    assert keras_mwm.seconds_to_first_step > 0 and keras_mwm.cpu_seconds_per_step > 0  # both workers' CPU time
    planned = Plan(rows=tuple(rows[name] for name in measured))
    out = {r["name"]: r for r in results(planned, measured, {})["rows"]}
    ips = {name: m.images_per_second for name, (m,) in measured.items()}
    assert out["tfdist_fit"]["ratio"]["median"] == pytest.approx(ips["tfdist_fit"] / ips["keras_fit"])
    assert out["multi_worker_mirrored_2"]["ratio_to_keras"]["median"] == pytest.approx(
        ips["multi_worker_mirrored_2"] / ips["keras_fit_multi_worker_mirrored_2"])

