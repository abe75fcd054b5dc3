"""The manifests of a cluster spec in one of five forms (``python -m tfdist.manifest``): plain Jobs and a
Service, a TFJob, a JobSet, a TrainJob or a Volcano Job, as one YAML stream.
"""

from __future__ import annotations

from typing import Callable

from tfdist import deploy
from tfdist.cluster.spec import ClusterSpec
from tfdist.deploy import common, jobset, kubernetes, trainjob, volcano
from tfdist.errors import UserError

#: The ``--form`` values: the plain and legacy forms, then the gang-admitted ones (``deploy.FORMS``).
FORMS = (*kubernetes.EMITS, *deploy.FORMS)

#: Form -> (spec, deployment, volume, doctor=) -> its documents.
_DOCUMENTS: dict[str, Callable[..., list[dict]]] = {
    "kubernetes": lambda spec, deployment, volume, doctor: kubernetes.manifests(spec, deployment),
    "tfjob": lambda spec, deployment, volume, doctor: [kubernetes.tfjob(spec, deployment)],
    "jobset": lambda *args, **kwargs: [jobset.jobset(*args, **kwargs)],
    "trainjob": trainjob.trainjob,  # the TrainingRuntime and the TrainJob
    "volcano": lambda *args, **kwargs: [volcano.volcano_job(*args, **kwargs)],
}


def check_form(form: str, *, volume: str | None, doctor: bool) -> None:
    """``form`` is one of ``FORMS``; a gang-admitted form has its ``volume``, the others neither it nor ``doctor``.

    Raises:
      UserError: an unknown form, a missing volume, or a volume or doctor run a plain form cannot carry.
    """
    if form not in FORMS:
        raise UserError(f"Invalid value for `--form`. Received: form={form!r}. Expected one of: {', '.join(FORMS)}.")
    if form in deploy.FORMS and volume is None:
        raise UserError(
            f"Missing `--volume` for --form={form}. Received: volume=None. Expected the PersistentVolumeClaim "
            f"that holds --model_dir for every pod (mounted at {common.MODEL_MOUNT}), e.g. --volume unet-runs."
        )
    stray = [f"--{name}" for name, given in (("volume", volume is not None), ("doctor", doctor)) if given]
    if form not in deploy.FORMS and stray:
        raise UserError(
            f"Unexpected `{stray[0]}` with --form={form}. Received: {', '.join(stray)}. "
            f"Expected it with --form {' or --form '.join(deploy.FORMS)} only."
        )


def render(form: str, spec: ClusterSpec, deployment: kubernetes.Deployment, *, volume: str | None = None,
           doctor: bool = False) -> str:
    """The documents of ``form`` for every task of ``spec``, as one YAML stream.

    Args:
      form: one of ``FORMS``.
      spec: the cluster, one pod per task.
      deployment: the image, the train command and the resources of every task.
      volume: the PersistentVolumeClaim mounted where ``--model_dir`` lies (the gang-admitted forms).
      doctor: the pods run ``tfdist.doctor`` instead of training (the gang-admitted forms).

    Raises:
      UserError: as ``check_form``.
    """
    check_form(form, volume=volume, doctor=doctor)
    return kubernetes.to_yaml(_DOCUMENTS[form](spec, deployment, volume, doctor=doctor))
