"""The two places of Keras' TensorFlow trainer that fail across workers, replaced; and ``fit`` wrapped."""

from __future__ import annotations

import contextlib
import functools
import inspect

from tfdist.errors import UserError
from tfdist import _compat
from tfdist.keras_fit.parameter_server import fit_under_coordinator, on_the_coordinator
from tfdist.strategies import traits_of

#: The line of ``reduce_per_replica`` that fails on scalar logs across workers.
BUGGY_REDUCE = 'strategy.reduce("MEAN", v, axis=0)'
#: The reduction of a data batch in ``_maybe_symbolic_build`` that fails across workers.
BUGGY_BUILD = "self.distribute_strategy.reduce("


def check(module) -> None:
    """Refuse a Keras whose TensorFlow trainer is not the one the fix replaces parts of.

    Raises:
        UserError: a function the fix replaces is missing or reads otherwise.
    """
    import keras

    cls = getattr(module, "TensorFlowTrainer", None)
    found = {
        "reduce_per_replica": BUGGY_REDUCE in _source(getattr(module, "reduce_per_replica", None)),
        "_maybe_symbolic_build": BUGGY_BUILD in _source(getattr(cls, "_maybe_symbolic_build", None)),
        "_symbolic_build": callable(getattr(cls, "_symbolic_build", None)),
        "_collective_all_reduce_multi_worker": callable(getattr(module, "_collective_all_reduce_multi_worker", None)),
        "fit": "callbacks" in _parameters(getattr(cls, "fit", None)),
        # Its steps read the model's jit_compile when they are made (xla.install).
        "_make_function": "jit_compile=self.jit_compile" in _source(getattr(cls, "_make_function", None))
        and all(callable(getattr(cls, f"make_{step}_function", None)) for step in ("train", "test", "predict")),
    }
    differs = [name for name, ok in found.items() if not ok]
    if differs:
        raise UserError(
            f"Unsupported Keras {keras.__version__} for tfdist's fix of Keras' own fit across workers "
            f"(keras#20585): its TensorFlow trainer differs in {', '.join(differs)}. Received: keras "
            f"{keras.__version__}. Expected the trainer of Keras 3.10 to 3.15; or train with "
            "tfdist.fit(model_fn, ...), which does not use Keras' trainer."
        )


def _source(function) -> str:
    try:
        return inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return ""


def _parameters(function) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters) if function is not None else ()
    except (TypeError, ValueError):
        return ()


def install(fit) -> None:
    """Replace the two failing places and wrap ``fit`` (once per process).

    Args:
        fit: ``tfdist.fit``, which trains Keras' own ``fit`` under a parameter-server strategy.

    Raises:
        UserError: Keras' trainer differs (``check``).
    """
    module = _compat.keras_tensorflow_trainer()
    cls = module.TensorFlowTrainer
    if getattr(cls.fit, "_tfdist_fit", False):
        return
    check(module)
    multi_worker = module._collective_all_reduce_multi_worker
    module.reduce_per_replica = _fixed_reduce(module.reduce_per_replica, multi_worker)
    cls._maybe_symbolic_build = _fixed_build(cls._maybe_symbolic_build, multi_worker)
    cls.fit = _wrapped_fit(cls.fit, multi_worker, functools.partial(fit_under_coordinator, fit=fit))
    cls.evaluate = on_the_coordinator(cls.evaluate)
    cls.predict = on_the_coordinator(cls.predict)
    cls.predict_on_batch = _split_on_batch(cls.predict_on_batch)


def _split_on_batch(original):
    """``predict_on_batch`` that gives each replica its slice of the batch, as ``predict`` does: Keras hands the
    whole batch to every replica and concatenates their outputs (N times one device's rows)."""

    @functools.wraps(original)
    def predict_on_batch(self, x):
        from keras import tree

        if self.distribute_strategy.num_replicas_in_sync == 1:
            return original(self, x)
        rows = int(tree.flatten(x)[0].shape[0])
        return self.predict(x, batch_size=max(rows, 1), verbose=0)

    return predict_on_batch


def _fixed_reduce(original, multi_worker):
    """``reduce_per_replica`` that averages across workers with ``axis=None``, as Keras does in one process."""

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        from keras import tree

        if reduction in ("auto", "mean") and multi_worker(strategy) and traits_of(strategy) is not None:
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    return reduce_per_replica


def _fixed_build(original, multi_worker):
    """``_maybe_symbolic_build`` that builds from the type of the data, without reading a batch of it.

    Keras reads the first batch (which starts an iteration: a Dataset that reshuffles each iteration shows the
    first epoch its second order) and reduces its replica slices into one, which fails across workers and, in
    one process, on a batch that splits unevenly. Here the model is built from one replica's ``element_spec``
    (``one_device.symbolic.build``): symbolically, as Keras builds it, or, for a model without a ``call`` (a GAN
    whose ``train_step`` calls its parts), from what its ``train_step`` creates, as Keras' ``fit`` builds it on
    one device.
    """

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        from tfdist.one_device import symbolic

        strategy = self._distribute_strategy
        if strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        across_workers = multi_worker(strategy)
        for compiled in [c for c in _compiled(self) if _outside(c, strategy)] if across_workers else []:
            _compat.unbuild_compiled(compiled)
        symbolic.build(self, _compat.epoch_element_spec(iterator))
        if across_workers:
            _refuse_metrics_outside(self, strategy)

    return _maybe_symbolic_build


def _compiled(model) -> list:
    """The model's ``CompileLoss`` and ``CompileMetrics`` that exist."""
    return [c for c in (_compat.compiled_loss(model), _compat.compiled_metrics(model)) if c is not None]


def _outside(compiled, strategy) -> bool:
    """Whether ``compiled`` is built with a metric variable that ``strategy`` does not own.

    Such a variable (a compiled metric that ``tfdist.fit``'s own loop or another strategy built) sums this
    worker's examples only: Keras then reads this worker's share as the metric. Made under the strategy's
    scope, it is a sync-on-read variable that Keras' reading sums over every replica and worker.
    """
    return bool(getattr(compiled, "built", False)) and any(
        not strategy.extended.variable_created_in_scope(v.value) for v in compiled.variables)


def _refuse_metrics_outside(model, strategy) -> None:
    """Refuse a compiled metric whose variables the strategy does not own once Keras has built them again.

    Raises:
        UserError: a metric object given to ``compile`` was made outside ``strategy.scope()``.
    """
    for compiled in _compiled(model):
        for variable in compiled.variables:
            if not strategy.extended.variable_created_in_scope(variable.value):
                raise UserError(
                    f"Invalid metric for Keras' own fit and evaluate across workers: {variable.path} was made "
                    "outside the strategy's scope, so each worker would report its own share of the examples. "
                    "Received: a metric object made outside strategy.scope(). Expected the model built and "
                    "compiled inside `with strategy.scope():`.")


def _wrapped_fit(original, multi_worker, coordinated_fit):
    """``fit`` that trains under a parameter-server strategy by ``coordinated_fit(model, arguments)``, and
    otherwise runs Keras' ``fit`` inside the ``around`` of every fix of ``fixes.FIXES`` that has one, each given
    the model, the call's arguments and this worker's placement across workers (None in one process)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        from tfdist.keras_fit.fixes import FIXES
        from tfdist.runtime.who import placement_of

        strategy = self.distribute_strategy
        arguments = signature.bind(self, *args, **kwargs).arguments
        known = traits_of(strategy)
        if known is not None and known.coordinator:
            return coordinated_fit(self, {k: v for k, v in arguments.items() if k != "self"})
        placement = placement_of(strategy) if multi_worker(strategy) else None
        with contextlib.ExitStack() as around:
            for fix in FIXES:  # in order: the first is outermost
                if hasattr(fix, "around"):
                    around.enter_context(fix.around(self, arguments, placement))
            return original(self, *args, **kwargs)

    fit._tfdist_fit = True
    return fit
