"""``python -m tfdist.doctor``: can this cluster start, and do its tasks agree? Checked before training."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import time
from pathlib import Path

from absl import flags

from tfdist import strategies
from tfdist.cluster import files, sources
from tfdist.doctor import agree
from tfdist.doctor import probe as doctor
from tfdist.doctor import meet
from tfdist.cluster.spec import ENVIRONMENT_CLUSTERS, SLURM, ClusterSpec, source_name
from tfdist.cluster.task import Task
from tfdist.cli import only_flags, require_finite, run_main
from tfdist.errors import DONE_EXIT_CODE, USAGE_EXIT_CODE, UserError, check_directory

FLAGS = flags.FLAGS

#: ``--devices``: how a task counts its GPUs.
DEVICES = ("tensorflow", "driver", "none")

#: Where the NVIDIA driver lists the GPUs of this machine (one folder each).
DRIVER_GPUS = Path(strategies.host.NVIDIA_DRIVER_GPUS)


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none."""
    flags.DEFINE_string(
        "cluster", None,
        "Cluster spec file (YAML or JSON), `slurm`: the cluster of this Slurm job step, or `kubernetes`: "
        "of this pod (default: TF_CONFIG's).", flag_values=flag_values,
    )
    flags.DEFINE_string("task", None, "This task, as type:index: meet the others (else probe them from here).",
                        flag_values=flag_values)
    flags.DEFINE_string("slurm_tasks", "", "With --cluster slurm: the task types of the Slurm step, e.g. "
                        "worker=2,ps=1.", flag_values=flag_values)
    flags.DEFINE_string("strategy", None, "Check that the cluster fits this strategy (default: no check).",
                        flag_values=flag_values)
    flags.DEFINE_bool("meet", True, "With a task: meet the other tasks; --nomeet: only probe them from here.",
                      flag_values=flag_values)
    flags.DEFINE_bool("running", False, "Probing: the cluster should be up, every task's port must answer.",
                      flag_values=flag_values)
    flags.DEFINE_string("model_dir", None, "Meeting: check that this is the same shared storage on every task.",
                        flag_values=flag_values)
    flags.DEFINE_float("connect_timeout", 60.0, "Meeting: seconds to wait for the other tasks to show up.",
                       lower_bound=0.0, flag_values=flag_values)
    require_finite("connect_timeout", flag_values=flag_values)
    flags.DEFINE_enum("devices", "tensorflow", DEVICES, "Meeting: count GPUs as TensorFlow sees them (imports "
                      "it, seconds), from the NVIDIA driver and CUDA_VISIBLE_DEVICES (fast), or not at all.",
                      flag_values=flag_values)


# --------------------------------------------------------------------------- what this task says of itself


def _version(*distributions: str) -> str:
    """The installed version of the first of ``distributions`` that is installed ("" when none is)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def _driver_uuids() -> list[str]:
    """The UUID of each GPU the driver lists (``GPU UUID`` of its ``information`` file); [] when one is unreadable."""
    uuids = []
    for gpu in sorted(DRIVER_GPUS.iterdir()):
        try:
            match = re.search(r"^GPU UUID:\s*(\S+)", (gpu / "information").read_text(errors="replace"), re.M)
        except OSError:
            return []
        if match is None:
            return []
        uuids.append(match.group(1) if match.group(1).startswith("GPU-") else f"GPU-{match.group(1)}")
    return uuids


def driver_gpus() -> int:
    """GPUs the NVIDIA driver lists, as ``CUDA_VISIBLE_DEVICES`` narrows them (``strategies.cuda_visible_gpus``)."""
    if not DRIVER_GPUS.is_dir():
        return 0
    count = len(list(DRIVER_GPUS.iterdir()))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    uuids = _driver_uuids() if visible and visible.strip().startswith("GPU-") else ()
    return strategies.cuda_visible_gpus(visible, count, uuids)


def _gpus(how: str) -> int | None:
    if how == "none":
        return None
    if how == "driver":
        return driver_gpus()
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def own_report(task: Task, model_dir: str, devices: str) -> agree.Report:
    """This task's report: its cluster, versions and GPUs (``--devices``), and ``model_dir``."""
    return agree.Report(
        task=task.name, cluster=task.spec.as_dict(), python=platform.python_version(),
        tensorflow=_version("tensorflow", "tensorflow-cpu", "tf-nightly"), keras=_version("keras"),
        tfdist=_version("tfdist"), gpus=_gpus(devices), model_dir=os.path.abspath(model_dir) if model_dir else "",
    )


# --------------------------------------------------------------------------- the two modes


def _verdict(lines: list[str], problems: list[str], ok: str) -> int:
    """Print the report, then the problems; the exit status."""
    end = ok if not problems else f"{len(problems)} problem{'s' if len(problems) > 1 else ''}: the cluster cannot start"
    print("\n".join([*lines, *problems, f"doctor: {end}"]), flush=True)
    return USAGE_EXIT_CODE if problems else DONE_EXIT_CODE


def probe(spec: ClusterSpec) -> int:
    """Probe every task of ``spec`` from here and print the table and problems; the exit status."""
    started = time.monotonic()
    problems: list[str] = []
    if FLAGS.strategy is not None:
        try:
            strategies.check_strategy(spec, FLAGS.strategy)
        except UserError as e:
            problems.append(f"--strategy={FLAGS.strategy}: {e}")
    probes = doctor.probe_cluster(spec, running=FLAGS.running)
    head = (f"doctor: {source_name(spec.source)}, {spec.num_tasks} tasks, probed from {socket.gethostname()} "
            f"in {time.monotonic() - started:.1f} s{' (--running)' if FLAGS.running else ''}")
    problems = [*doctor.problems(probes, running=FLAGS.running), *problems]
    return _verdict([head, *doctor.table(probes), *doctor.warnings(probes)], problems, "the cluster can start")


def gather(task: Task) -> int:
    """Meet the other tasks as ``task``, print the same report as every one of them; the exit status."""
    if FLAGS.strategy is not None:
        strategies.check_strategy(task.spec, FLAGS.strategy)
    started = time.monotonic()
    report = own_report(task, FLAGS.model_dir or "", FLAGS.devices)
    gathered = time.monotonic() - started
    met = meet.meet(task, report, timeout=FLAGS.connect_timeout)
    spec = task.spec
    leader = "{}:{}".format(*spec.leader())
    coordinator = strategies.traits(FLAGS.strategy).coordinator if FLAGS.strategy else "ps" in spec.tasks
    addresses = {f"{t}:{i}": spec.address(t, i) for t, i in spec.task_list()}
    problems = [f"{name} ({addresses[name]}): never answered within --connect_timeout={FLAGS.connect_timeout:g}s "
                f"({why}). Fix: start `python -m tfdist.doctor` for {name} on its host with the same cluster spec "
                "(or a larger --connect_timeout)." for name, why in met.missing.items()]
    problems += [f"{name} ({addresses[name]}): left before the end of the meeting ({why}). Fix: run the doctor "
                 "again on every task." for name, why in met.left.items()]
    problems += agree.problems(met.reports, met.observations, leader=leader,
                               compute=agree.compute_tasks(spec.tasks, coordinator=coordinator))
    head = (f"doctor: {task.name} met {len(met.reports)} of {spec.num_tasks} tasks of {source_name(spec.source)} "
            f"in {met.seconds:.1f} s (its own report took {gathered:.1f} s)")
    table = agree.table(met.reports, met.observations, leader=leader, addresses=addresses)
    return _verdict([head, *table], problems, "every task agrees: the cluster can start")


def main(argv: list[str]) -> int:
    """Probe or meet the cluster of the flags (or TF_CONFIG); see the module docstring."""
    only_flags(argv)
    if FLAGS.strategy is not None:
        strategies.traits(FLAGS.strategy)  # an unknown name is one line on stderr, before any probe
    if FLAGS.cluster and FLAGS.cluster not in ENVIRONMENT_CLUSTERS and not FLAGS.task:
        sources.check_flags(FLAGS.cluster, FLAGS.task, FLAGS.slurm_tasks)
        task, spec = None, files.load_cluster_spec(FLAGS.cluster)
    else:
        task = sources.resolve_task(FLAGS.cluster, FLAGS.task, slurm_tasks=FLAGS.slurm_tasks)
        if task is None:
            raise UserError(
                f"Missing `--cluster`. Received: cluster={FLAGS.cluster!r} and no TF_CONFIG. Expected a cluster "
                f"spec file (YAML or JSON), {SLURM} inside a Slurm job step, or TF_CONFIG set (tfdist.launch)."
            )
        spec = task.spec
    meeting = task is not None and FLAGS.meet
    wrong = [f"--{name}" for name in (("running",) if meeting else ("model_dir", "connect_timeout", "devices"))
             if FLAGS[name].present]
    if wrong:
        raise UserError(
            f"Unexpected `{wrong[0]}` {'with a task (a meeting)' if meeting else 'without a task (probing)'}. "
            f"Received: {', '.join(wrong)}. Expected "
            + ("--running only without --task (or with --nomeet)." if meeting
               else "--model_dir, --connect_timeout and --devices only with --task or TF_CONFIG (a meeting).")
        )
    if FLAGS.model_dir:
        check_model_dir(FLAGS.model_dir)
    return gather(task) if meeting else probe(spec)


def check_model_dir(model_dir: str) -> None:
    """Refuse a ``--model_dir`` that cannot be a directory: a file, or a path under one."""
    check_directory(model_dir, "--model_dir",
                    "Expected the run directory on the storage every task shares (existing or new).", writable=False)


def entry() -> None:
    """The ``tfdist-doctor`` console script (``setup.cfg``), as ``python -m tfdist.doctor``."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
