"""Keras' own ``model.fit`` under ``ParameterServerStrategy``: trained by ``tfdist.fit``'s coordinator loop; its
``evaluate`` and ``predict`` run by the coordinator.

``tfdist.fit`` is passed in (``install(fit)``) rather than imported: ``tfdist.fit`` installs this package.
"""

from __future__ import annotations

import functools

from tfdist import _compat
from tfdist.errors import UserError
from tfdist.strategies import traits_of

#: Keras ``fit`` arguments that ``tfdist.fit`` does not take, with the value that means "not used".
NOT_TAKEN = (("validation_batch_size", None),)
#: Keras ``fit`` arguments passed on to ``tfdist.fit`` as they are (when given); ``tfdist.fit`` checks them.
PASSED = ("batch_size", "epochs", "callbacks", "validation_data", "validation_split", "validation_freq", "shuffle",
          "class_weight", "sample_weight", "initial_epoch", "steps_per_epoch", "validation_steps")


def fit_under_coordinator(model, arguments: dict, fit):
    """``model.fit(**arguments)`` under the session's ``ParameterServerStrategy``, by ``fit`` (``tfdist.fit``).

    Raises:
        UserError: the strategy is not the session's, an argument ``tfdist.fit`` does not take, or one it
          refuses (``tfdist.fit``'s checks).
    """
    from tfdist.runtime import who

    session = who.current()
    if session is None or session.strategy is not model.distribute_strategy:
        raise UserError(
            "Invalid strategy for Keras' own model.fit: Keras 3 has no ParameterServerStrategy path (keras#18624), "
            "and tfdist trains one only under the strategy tfdist.setup made. Received: a ParameterServerStrategy "
            "made without tfdist.setup. Expected strategy = tfdist.setup('parameter_server') at the top of the "
            "script, or tfdist.fit(model_fn, x, y, ..., strategy='parameter_server')."
        )
    used = [f"{name}={arguments[name]!r}" for name, unused in NOT_TAKEN
            if name in arguments and arguments[name] != unused]
    if used:
        raise UserError(
            f"Invalid argument for model.fit under parameter_server: {used[0].split('=')[0]}. Received: "
            f"{', '.join(used)}. Expected validation_batch_size=None (validation runs in batches of batch_size), "
            "or validation_data as a Dataset batched as it should run."
        )
    verbose = arguments.get("verbose", "auto")
    passed = {name: arguments[name] for name in PASSED if arguments.get(name) is not None}
    return fit(lambda: model, arguments.get("x"), arguments.get("y"), verbose=1 if verbose == "auto" else verbose,
               **passed)


def on_the_coordinator(method):
    """Keras' ``evaluate`` or ``predict`` that, under ``ParameterServerStrategy``, the coordinator runs itself.

    Keras 3 has no parameter-server path for them (it asks for per-worker datasets); the coordinator computes
    the same forward pass over the whole input in its own process, reading the variables on the ps tasks.
    """
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        known = traits_of(self.distribute_strategy)
        if known is None or not known.coordinator:
            return method(self, *args, **kwargs)
        with _compat.model_without_strategy(self):
            return method(self, *args, **kwargs)

    return wrapped
