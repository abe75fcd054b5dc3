"""One process of a check: it sets itself up for its group of modes, then trains its ``[seed, mode]`` pairs, each
beside Keras' own one-device ``fit``, writing each verdict as it comes (``python -m tfdist.check.worker SPEC``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tfdist.check import build, runs, space, verdict
from tfdist.check.user import UserSetup
from tfdist.errors import end_process

#: The control case: a dense model and plain SGD on batches that split evenly, whose difference from one device
#: is the noise floor of this process's replicas, in float32 and in mixed_float16 (a drawn case's own).
CONTROL = dict(model="dense", labels="sparse", optimizer="SGD", options=(), schedule=False, loss_scale=False,
               clip=None, rows=64, batch=16, epochs=2, dataset=False, sample_weight=False, class_weight=False,
               callback=None, metrics=(), validation=None, validation_freq=1, steps_per_execution=1,
               jit_compile=False, mixed_precision=False)


def _set_up(group: str):
    """Set this process up for ``group``; returns the cluster resolver of a coordinator's in-process cluster."""
    import tfdist

    if group == "workers":
        tfdist.setup("multi_worker_mirrored")
        return None
    from tfdist.strategies import setup_host

    coordinator = group == "coordinator"
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    setup_host(cpu_devices=1 if coordinator else 2, inter_op_threads=4 if coordinator else 0)
    tfdist.patch_keras()
    if not coordinator:
        return None
    from tfdist.deploy.in_process import in_process_cluster

    return in_process_cluster(num_workers=2, num_ps=1)


def _task() -> str:
    """This process's task under TF_CONFIG (``worker-1``), or ``local``."""
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task")
    return f"{task['type']}-{task['index']}" if task else "local"


def _noise_floor(mode: str | None, mixed_precision: bool, resolver) -> float:
    """The control case's difference from one device in ``mode`` (float32, or mixed_float16): 0 without one."""
    if mode is None:
        return 0.0
    control = build.Drawn(space.Case(seed=1, **{**CONTROL, "mixed_precision": mixed_precision}))
    measured = runs.train(control, mode, cluster_resolver=resolver)
    return verdict.noise_floor(measured, runs.reference(control)) if "history" in measured else 0.0


def _setup(spec: dict, seed: int):
    """The setup of a case of the spec: drawn from the space, or the user's own (seed 0)."""
    return UserSetup(spec["model"]) if spec.get("model") else build.Drawn(space.draw(seed))


def main(spec: dict) -> int:
    """Train the spec's ``work``, its ``[seed, mode]`` pairs in order, writing the report after each.

    The report says which pair runs (``running``) until its verdict is written. After a verdict that crashed,
    the process ends at once: a crash can leave the collectives of the process aborted, so the check runs the
    pairs after it in fresh processes (``groups``).
    """
    group = spec["group"]
    modes = list(dict.fromkeys(mode for _, mode in spec["work"]))
    resolver = _set_up(group)
    task = _task()
    output = Path(spec["output"]) / f"{group}-{spec.get('attempt', 0)}-{task}.json"
    replicated = [m for m in modes if runs.MODES[m].replicated and not runs.MODES[m].asynchronous]
    tolerances = {}

    def tolerance(mixed_precision: bool) -> float:
        """The tolerance of a precision, its control measured the first time a case of it needs one: every
        worker of a group reaches the same cases in the same order, so their controls' collectives meet."""
        if mixed_precision not in tolerances:
            floor = _noise_floor(replicated[0] if replicated else None, mixed_precision, resolver)
            tolerances[mixed_precision] = verdict.tolerance(floor)
            measured = {"noise_floor": floor, "tolerance": tolerances[mixed_precision]}
            if mixed_precision:
                report["mixed_float16"] = measured
            else:
                report.update(measured)
        return tolerances[mixed_precision]

    records = []
    report = {"task": task, "group": group, "noise_floor": None, "tolerance": None, "mixed_float16": None,
              "after_crash": spec.get("after_crash"), "records": records, "running": None}
    tolerance(False)  # float32's, before the first case: every report has it
    fresh = {"after_crash": spec["after_crash"]} if spec.get("after_crash") else {}
    setups, references = {}, {}
    files = str(Path(spec["output"]) / "files")  # the callbacks' files of every run, each worker's the same

    def write(**extra):
        output.write_text(json.dumps({**report, **extra}, default=float))

    for seed, mode in spec["work"]:
        if seed not in setups:
            setups[seed] = setup = _setup(spec, seed)
            print(f"{task}: {setup.describe()}", file=sys.stderr, flush=True)
            try:
                references[seed] = runs.reference(setup, directory=runs.directory_for(files, seed, f"reference-{task}"))
            except Exception as error:  # noqa: BLE001 - a case Keras itself cannot train is out of the space
                records.append({"seed": seed, "mode": "reference", "class": "invalid",
                                "detail": runs.crash_line(error), **fresh})
        if seed not in references:
            continue
        setup = setups[seed]
        report["running"] = [seed, mode]
        write()
        got = runs.train(setup, mode, cluster_resolver=resolver, directory=runs.directory_for(files, seed, mode))
        tol = tolerance(bool(getattr(getattr(setup, "case", None), "mixed_precision", False)))
        found = verdict.verdict(got, references[seed], tol=tol, asynchronous=runs.MODES[mode].asynchronous)
        records.append({"seed": seed, "mode": mode, **found, **fresh})
        report["running"] = None
        if found["class"] == "crashed":
            write(stopped="crashed")
            # At once, without the teardown, which would wait on the collectives of the crashed peers; and with
            # status 0, after which tfdist.launch lets the other workers end their own verdict of the pair.
            end_process(0)
        write()
    write(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
