"""``python -m tfdist.doctor``: checks a cluster before training (addresses, ports, clocks, shared storage)."""
