"""The one loop, with no model-specific knowledge: the ``Plan`` a client gives it (steps, inputs, learning rate,
hooks), the training state, the loops, the ``Controller`` with its schedule, checkpoints and outputs."""
