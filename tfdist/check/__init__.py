"""The differential check: Keras training setups drawn from a seeded space, trained in every mode of tfdist and
compared with Keras' own one-device ``fit`` on every worker (``python -m tfdist.check``).
"""
