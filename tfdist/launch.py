"""``python -m tfdist.launch``: every task of a cluster spec as a process on this machine (torchrun for TensorFlow).

The flags go to ``deploy.local.launch``, which holds the policy and returns the exit status.
"""

from __future__ import annotations

import sys

from absl import flags

from tfdist import cluster as cluster_lib
from tfdist.deploy.local import GRACE_SECONDS, check_local, launch, localize, stops_cluster
from tfdist.cli import require_finite, run_main
from tfdist.errors import UserError

FLAGS = flags.FLAGS

#: The library's names, reached here too by scripts that import the CLI's module.
__all__ = ["GRACE_SECONDS", "check_local", "define_flags", "entry", "launch", "localize", "main", "stops_cluster"]


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none."""
    flags.DEFINE_string("cluster", None, "Cluster spec file (YAML or JSON).", flag_values=flag_values)
    flags.DEFINE_bool("local", False, "Rewrite every address to 127.0.0.1 on free ports.", flag_values=flag_values)
    flags.DEFINE_integer("max_restarts", 0, "Restart every task after a failure (a preempted task's, status 42, "
                         "included), up to this many times.",
                         lower_bound=0, upper_bound=2**63 - 1, flag_values=flag_values)
    flags.DEFINE_float("grace_seconds", GRACE_SECONDS,
                       "Seconds between SIGTERM and SIGKILL when stopping tasks. A tfdist task takes SIGTERM as a "
                       "preemption: it saves a checkpoint of the step reached, then exits 42, so leave time for one "
                       "checkpoint write; tasks that end sooner are not waited for.",
                       lower_bound=0.0, flag_values=flag_values)
    flags.DEFINE_float("shutdown_timeout", 60.0, "Seconds the other tasks may run on after the leader has finished.",
                       lower_bound=0.0, flag_values=flag_values)
    flags.DEFINE_bool("show_startup_noise", False, "Pass on TensorFlow's known start-up lines from the tasks' output "
                      "(cuInit, cudart, oneDNN, ...), which are dropped by default, as tfdist's own CLIs drop them "
                      "(TFDIST_TF_LOGS=1 does the same).", flag_values=flag_values)
    require_finite("grace_seconds", "shutdown_timeout", flag_values=flag_values)


def main(argv: list[str]) -> int:
    """Launch every task of ``--cluster`` running the command after ``--``; see the module docstring."""
    if not FLAGS.cluster:
        raise UserError(
            f"Missing `--cluster`. Received: cluster={FLAGS.cluster!r}. "
            "Expected a cluster spec file (YAML or JSON), e.g. --cluster configs/clusters/local_mwm.yaml."
        )
    command = argv[1:]
    check_before_dashes(sys.argv, command)
    spec = cluster_lib.load_cluster_spec(FLAGS.cluster)
    return launch(spec, command, local=FLAGS.local, max_restarts=FLAGS.max_restarts, grace=FLAGS.grace_seconds,
                  shutdown_timeout=FLAGS.shutdown_timeout, show_startup_noise=FLAGS.show_startup_noise)


def check_before_dashes(raw: list[str], command: list[str]) -> None:
    """Refuse words before ``--`` that are not flags: absl would make them the start of the command.

    ``raw`` is the command line as given and ``command`` what absl left of it. A boolean flag takes no separate
    value, so ``--show_startup_noise yes -- true`` would otherwise run ``yes true`` in every task.

    Raises:
        UserError: ``command`` does not come, whole, after the first ``--`` of ``raw``.
    """
    after = raw[raw.index("--") + 1:] if "--" in raw else []
    if command[len(command) - len(after):] == after and len(command) > len(after):
        stray = command[:len(command) - len(after)]
        raise UserError(
            f"Unexpected argument before --: {stray[0]!r} is not a flag (a boolean flag takes no separate value: "
            f"--show_startup_noise or --noshow_startup_noise). Received: {' '.join(raw[1:])}. "
            "Expected flags before -- and the command after it, e.g. --cluster FILE -- python -m tfdist.train."
        )


def entry() -> None:
    """The ``tfdist-launch`` console script."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
