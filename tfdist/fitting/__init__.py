"""``tfdist.fit``: any compiled Keras model trained through tfdist's loop (Keras' own ``fit`` across workers is
``keras_fit``; what both need, ``one_device``)."""
