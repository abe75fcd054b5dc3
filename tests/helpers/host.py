"""The host of the TensorFlow tiers: 2 logical CPUs and 4 inter-op threads, set once, before TensorFlow starts.

Keras' own distributed tests split CPU:0 into logical devices the same way, so that ``mirrored`` and
``central_storage`` have 2 replicas on a machine without GPUs. Tests that need a fresh runtime (clusters,
other device counts) run in subprocesses. Importing this module sets the host up; a second import is free.
"""

from tfdist.strategies import setup_host

setup_host(cpu_devices=2, inter_op_threads=4)
