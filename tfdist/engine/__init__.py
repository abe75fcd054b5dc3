"""The one loop, with no model-specific knowledge: the ``Steps`` protocol, the training state, the loops, the
``Controller`` with its schedule, checkpoints and outputs."""
