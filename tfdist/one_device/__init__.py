"""Keras under a strategy computes one device's step: what both fits need, ``tfdist.fit`` and Keras' own ``fit``
across workers."""
