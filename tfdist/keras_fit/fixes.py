"""The fixes that make Keras' own ``fit``, ``evaluate`` and ``predict`` right across replicas and workers, as
one list: each is a module of this package with ``install()`` (once per process, into Keras or TensorFlow) and/or
``around(model, arguments, placement)`` (a context around one ``fit``; the first in the list is outermost). What
``tfdist.fit`` needs too is ``one_device``'s, installed before these; a fix here calls it where one ``fit`` needs it.
"""

from __future__ import annotations

from tfdist.keras_fit import (batch_norm, centered_rmsprop, chief_files, empty_slices, executions, finish, own_steps,
                              owned_batches, preemption, saving, strategy_once, user_errors, x_alone, xla)

#: In order: ``finish`` waits for every worker once the others have ended; the refusals come before the
#: step's changes; ``preemption``'s vote wraps whatever step the model has by then.
FIXES = (
    finish,            # across workers, fit returns on every worker once all have ended it
    xla,               # jit_compile: a step XLA cannot compile (CPU collectives, variables apart) without XLA
    x_alone,           # fit(x) without targets builds the model and optimizer; the compiled loss stays the step's
    owned_batches,     # a generator's or PyDataset's batches across replicas are copies, not the user's arrays
    executions,        # steps_per_execution over replicas: across workers as Keras loops, in one process a step a call
    strategy_once,     # one strategy per process: a second MultiWorkerMirroredStrategy is the first
    saving,            # a script's saves land once, the chief's, and every worker reads them whole
    user_errors,       # a UserError that leaves a script is one line and status 2
    centered_rmsprop,  # RMSprop(centered=True) on a sparse gradient: one line (Keras fails on one device)
    batch_norm,        # the warning for batch norm that normalizes each replica's slice alone
    empty_slices,      # a replica with no rows skips a conv net's pass (oneDNN mis-shapes an empty batch)
    own_steps,         # Keras' steps and a model's own compute one device's loss on the replica's share
    chief_files,       # callbacks on every worker, their files the chief's
    preemption,        # every worker stops at the same step, saves it, exits 42
)
