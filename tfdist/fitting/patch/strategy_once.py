"""One ``MultiWorkerMirroredStrategy`` per process: a second construction returns the first."""

from __future__ import annotations

import functools

from tfdist.errors import UserError
from tfdist.strategies import traits_of

_made: dict = {}


def install() -> None:
    """Make ``tf.distribute.MultiWorkerMirroredStrategy`` return the process' first instance; idempotent."""
    import tensorflow as tf

    cls = tf.distribute.MultiWorkerMirroredStrategy
    if getattr(cls.__init__, "tfdist_once", False):
        return
    new, init = cls.__new__, cls.__init__

    def __new__(klass, *args, **kwargs):
        first = _first(cls) if klass is cls else None
        if first is None:
            return new(klass) if new is object.__new__ else new(klass, *args, **kwargs)
        if _key(args, kwargs) != _made.get("key", _key((), {})):
            raise UserError(
                "Invalid second tf.distribute.MultiWorkerMirroredStrategy(...) in this process: TensorFlow sets "
                "the collectives up once per process, and a second strategy aborts the first one's. Received: "
                f"arguments {_describe(args, kwargs)} that differ from the first construction's. Expected the "
                "strategy built once, at the top of the script, and reused (or the same arguments again).")
        return first

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if _made.get("strategy") is self or _session_strategy() is self:
            return
        init(self, *args, **kwargs)
        _made.update(strategy=self, key=_key(args, kwargs))

    __init__.tfdist_once = True
    cls.__new__ = staticmethod(__new__)
    cls.__init__ = __init__


def _first(cls):
    return _made.get("strategy") or _session_strategy()


def _session_strategy():
    """The ``MultiWorkerMirroredStrategy`` that ``tfdist.setup`` made in this process, if any."""
    from tfdist.runtime import session

    current = session.current()
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
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"
