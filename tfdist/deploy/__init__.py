"""How tasks get started: local processes (the launcher), per-task commands, an in-process cluster, and
Kubernetes manifests: the plain (Jobs and a Service) and legacy (TFJob) forms in ``kubernetes``, and the
gang-admitted ``jobset``, ``trainjob`` and ``volcano`` forms (sharing ``common``).
"""

#: The ``tfdist.manifest --form`` values of the gang-admitted forms.
FORMS = ("jobset", "trainjob", "volcano")
