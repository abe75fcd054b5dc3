"""One ``MultiWorkerMirroredStrategy`` per process: a second construction returns the first; every other strategy
takes collective keys of its own, and one built beside a strategy across workers takes this process' own devices.

TensorFlow sets the collectives up once per process (a second ``MultiWorkerMirroredStrategy`` aborts the first
one's), and a ``MirroredStrategy()`` left to its default devices takes every task's logical devices once the
process is in a cluster, and crashes it (a segmentation fault); over this process' devices it works beside the
first, as ``OneDeviceStrategy`` and ``CentralStorageStrategy`` do. Two strategies of one process that number their
collective groups alike pair their collectives up (a second ``MirroredStrategy`` over other devices then fails), so
each numbers them from a base of its own, as TensorFlow's own tests make them.
"""

from __future__ import annotations

import functools
import inspect
import itertools

from tfdist.errors import UserError
from tfdist.strategies import strategy_classes, traits_of, traits_of_class

_made: dict = {}

#: The collective keys of each strategy of a process start this far apart (TensorFlow's own
#: tests raise ``MirroredStrategy``'s key base by as much for each strategy of a process).
KEY_SPACING = 100_000

_key_bases = itertools.count(KEY_SPACING, KEY_SPACING)


def install() -> None:
    """Make ``tf.distribute.MultiWorkerMirroredStrategy`` (and its subclass, the deprecated
    ``tf.distribute.experimental`` alias) return the process' first instance, and every other strategy class take
    collective keys of its own (and, built in a process across workers, this process' devices); idempotent."""
    import tensorflow as tf

    cls = tf.distribute.MultiWorkerMirroredStrategy
    if getattr(cls.__init__, "tfdist_once", False):
        return
    new, init = cls.__new__, cls.__init__

    def __new__(klass, *args, **kwargs):
        made = first() if _across_workers_class(klass) else None
        if made is None:
            return new(klass) if new is object.__new__ else new(klass, *args, **kwargs)
        if _key(args, kwargs) != _made.get("key", _key((), {})):
            raise UserError(
                "Invalid second tf.distribute.MultiWorkerMirroredStrategy(...) in this process: TensorFlow sets "
                "the collectives up once per process, and a second strategy aborts the first one's. Received: "
                f"arguments {_describe(args, kwargs)} that differ from the first construction's. Expected the "
                "strategy built once, at the top of the script, and reused (or the same arguments again).")
        return made

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if _made.get("strategy") is self or _session_strategy() is self:
            return
        init(self, *args, **kwargs)
        _made.update(strategy=self, key=_key(args, kwargs))

    __init__.tfdist_once = True
    cls.__new__ = staticmethod(__new__)
    cls.__init__ = __init__
    for other in strategy_classes(but=cls):
        if not getattr(other.__init__, "tfdist_once", False):
            other.__init__ = _keys_of_its_own(other.__init__)


def _across_workers_class(klass: type) -> bool:
    """Whether ``klass`` builds a strategy across workers with collectives (``MultiWorkerMirroredStrategy``)."""
    known = traits_of_class(klass)
    return known is not None and known.multi_process and not known.coordinator


def _keys_of_its_own(init):
    """``init`` of a strategy class, made to build beside the process' other strategies: the strategy's collective
    keys are its own, and beside a strategy across workers a ``devices`` argument left out is this process' own
    devices."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        from tfdist import _compat

        _compat.set_collective_key_base(self, next(_key_bases))
        if _across_workers():
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # TensorFlow's own error follows
            if bound is not None and "devices" in signature.parameters and bound.arguments.get("devices") is None:
                bound.arguments["devices"] = own_devices()
                args, kwargs = bound.args[1:], bound.kwargs
        init(self, *args, **kwargs)

    __init__.tfdist_once = True
    return __init__


def own_devices() -> list[str]:
    """This process' logical GPUs, else its logical CPUs (what ``MirroredStrategy()`` takes on one machine), by
    their full names: once a process is in a cluster, TensorFlow lists every task's devices."""
    import tensorflow as tf

    from tfdist import _compat

    here = tf.DeviceSpec.from_string(_compat.this_task_device("/device:CPU:0"))

    def own(device) -> bool:
        spec = tf.DeviceSpec.from_string(device.name)
        return (spec.job, spec.replica, spec.task) == (here.job, here.replica, here.task)

    return ([d.name for d in tf.config.list_logical_devices("GPU") if own(d)]
            or [d.name for d in tf.config.list_logical_devices("CPU") if own(d)])


def _across_workers() -> bool:
    """Whether this process is one task of several (``tfdist.setup``'s cluster, or the script's first
    ``MultiWorkerMirroredStrategy`` across workers)."""
    from tfdist import _compat
    from tfdist.runtime import who

    current = who.current()
    if current is not None and not current.placement.task.is_local:
        return True
    made = _made.get("strategy")
    return made is not None and _compat.is_multi_worker(made)


def first():
    """The process' ``MultiWorkerMirroredStrategy``: the one ``tfdist.setup`` made, or the script's first; or None."""
    return _made.get("strategy") or _session_strategy()


def _session_strategy():
    """The ``MultiWorkerMirroredStrategy`` that ``tfdist.setup`` made in this process, if any."""
    from tfdist.runtime import who

    current = who.current()
    strategy = current.strategy if current is not None else None
    known = traits_of(strategy) if strategy is not None else None
    return strategy if known is not None and known.multi_process and not known.coordinator else None


def _key(args, kwargs) -> tuple:
    """The arguments of a construction as comparable values (a cluster resolver by its cluster and task)."""

    def value(v):
        if hasattr(v, "cluster_spec") and hasattr(v, "task_type"):
            return ("resolver", repr(v.cluster_spec().as_dict()), v.task_type, v.task_id)
        if v is not None and hasattr(v, "__dict__"):
            return (type(v).__name__, repr(sorted(vars(v).items())))
        return v

    return tuple(value(v) for v in args) + tuple(sorted((k, value(v)) for k, v in kwargs.items()))


def _describe(args, kwargs) -> str:
    """The arguments as typed, an object without a short repr by its type's name."""

    def shown(v):
        text = repr(v)
        return type(v).__name__ if text.startswith("<") else text

    parts = [shown(a) for a in args] + [f"{k}={shown(v)}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"
