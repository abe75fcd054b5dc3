"""How tasks get started: local processes (the launcher), per-task commands, Kubernetes manifests, and an
in-process cluster."""
