"""``tfdist.fit`` (any compiled Keras model through tfdist's loop) and Keras' own ``fit`` across workers
(``patch``)."""
