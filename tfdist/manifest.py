"""``python -m tfdist.manifest``: the Kubernetes manifests that run every task of a cluster spec.

    python -m tfdist.manifest --cluster configs/clusters/example.yaml --form jobset --image REGISTRY/tfdist:0.1.0 \\
        --volume unet-runs -- --model_dir /runs/unet
"""

from __future__ import annotations

from absl import flags

from tfdist import cluster, deploy, strategies
from tfdist.cluster.spec import ENVIRONMENT_CLUSTERS
from tfdist.deploy import common, kubernetes, manifests
from tfdist.deploy.output import write_output
from tfdist.cli import run_main
from tfdist.errors import UserError
from tfdist.segmentation.command import check_command

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Define this CLI's flags; called by ``entry`` so that importing the module defines none."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("cluster", None, "Cluster spec file (YAML or JSON): one pod per task.", **fv)
    flags.DEFINE_string("form", "kubernetes", f"The manifests' form: one of {', '.join(manifests.FORMS)}.", **fv)
    flags.DEFINE_string("strategy", None, "Every task's --strategy (default: the cluster's, as --strategy auto "
                        "chooses it); the cluster must fit it.", **fv)
    flags.DEFINE_string("image", None, "The container image (with tfdist installed).", **fv)
    flags.DEFINE_string("name", "tfdist", "The Service/Job name and the prefix of every task's host name.", **fv)
    flags.DEFINE_string("namespace", "", "The namespace of every object (default: none written, kubectl's).", **fv)
    flags.DEFINE_string("cpu", kubernetes.DEFAULT_CPU, "CPUs each task requests.", **fv)
    flags.DEFINE_string("memory", kubernetes.DEFAULT_MEMORY, "Memory each task requests (and is limited to).", **fv)
    flags.DEFINE_integer("gpus", kubernetes.DEFAULT_GPUS, "GPUs (nvidia.com/gpu) of each task but ps.", **fv)
    flags.DEFINE_string("volume", None, f"--form {', '.join(deploy.FORMS)}: the PersistentVolumeClaim (shared by "
                        f"every pod) mounted at {common.MODEL_MOUNT}, where --model_dir lies.", **fv)
    flags.DEFINE_bool("doctor", False, f"--form {', '.join(deploy.FORMS)}: the same pods run tfdist.doctor (they "
                      "meet and compare, and check --model_dir) instead of training; run it once before.", **fv)
    flags.DEFINE_string("output", None, "Write to this file instead of stdout.", **fv)


def main(argv: list[str]) -> int:
    """Print (or write to ``--output``) the manifests of ``--form`` for ``--cluster``; arguments after ``--`` are
    appended to every task's ``tfdist.train`` command."""
    extra = list(argv[1:])
    if not FLAGS.cluster or FLAGS.cluster in ENVIRONMENT_CLUSTERS:
        raise UserError(f"Invalid value for `--cluster`. Received: cluster={FLAGS.cluster!r}. Expected a cluster spec "
                        "file (YAML or JSON) with one address per task, e.g. --cluster configs/clusters/example.yaml.")
    manifests.check_form(FLAGS.form, volume=FLAGS.volume, doctor=FLAGS.doctor)
    spec = cluster.load_cluster_spec(FLAGS.cluster)
    if FLAGS.strategy is not None:
        strategies.check_strategy(spec, FLAGS.strategy)
    deployment = kubernetes.Deployment(
        image=_image(), strategy=FLAGS.strategy or "", train_args=tuple(extra), name=FLAGS.name,
        namespace=FLAGS.namespace, cpu=FLAGS.cpu, memory=FLAGS.memory, gpus=FLAGS.gpus)
    deployment.check(spec)  # the resources first: --gpus sizes the replicas that the global batch splits over
    strategy = deployment.strategy_for(spec)
    replicas = strategies.cluster_replicas(strategy, spec, FLAGS.gpus)  # None: the host's, left to the task
    check_command(extra, strategy=strategy, where=f"tfdist.manifest --form {FLAGS.form}", replicas=replicas)
    write_output(manifests.render(FLAGS.form, spec, deployment, volume=FLAGS.volume, doctor=FLAGS.doctor),
                        FLAGS.output)
    return 0


def _image() -> str:
    """``--image``, required: every pod runs it."""
    if not FLAGS.image:
        raise UserError(f"Missing `--image` for --form={FLAGS.form}. Received: image={FLAGS.image!r}. Expected the "
                        "container image to run, with tfdist installed, e.g. "
                        "--image registry.example.com/tfdist:0.1.0.")
    return FLAGS.image


def entry() -> None:
    """The ``tfdist-manifest`` console script."""
    run_main(main, define_flags)


if __name__ == "__main__":
    entry()
