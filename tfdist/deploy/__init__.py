"""Manifests that run a cluster spec on Kubernetes through a controller that admits the whole run at once.

- ``common``: what every form shares (shared storage for ``--model_dir``, the
  pod's variables for ``cluster.kubernetes``, the restart rules, one JobSet);
- ``jobset``: ``--emit jobset``, a JobSet and nothing else;
- ``trainjob``: ``--emit trainjob``, a Kubeflow Trainer v2 TrainJob and its plain TrainingRuntime;
- ``volcano``: ``--emit volcano``, a Volcano Job with the ``tensorflow`` and ``svc`` plugins.

``tfdist.kubernetes`` keeps the plain (Jobs and a Service) and the legacy (TFJob) forms.
"""

#: The ``--emit`` values of this package.
FORMS = ("jobset", "trainjob", "volcano")
