"""One strategy per process across workers: a second ``MultiWorkerMirroredStrategy`` construction returns the
first, and any other strategy built after one across workers is refused with one line (TensorFlow would crash)."""

from __future__ import annotations

import functools

from tfdist.errors import UserError
from tfdist.strategies import strategy_classes, traits_of

_made: dict = {}


def install() -> None:
    """Make ``tf.distribute.MultiWorkerMirroredStrategy`` return the process' first instance, and every other
    strategy class refuse to be built in a process across workers; idempotent."""
    import tensorflow as tf

    cls = tf.distribute.MultiWorkerMirroredStrategy
    if getattr(cls.__init__, "tfdist_once", False):
        return
    new, init = cls.__new__, cls.__init__

    def __new__(klass, *args, **kwargs):
        made = first() if klass is cls else None
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
    for other, name in strategy_classes(but=cls).items():
        if not getattr(other.__init__, "tfdist_once", False):
            other.__init__ = _refused_after_one_across_workers(name, other.__init__)


def _refused_after_one_across_workers(name: str, init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        across = _across_workers()
        if across is not None:
            raise UserError(
                f"Invalid {name}(...) in this process: it already has a strategy across workers ({across}), "
                "and TensorFlow cannot build a second strategy beside it (a MirroredStrategy built after one "
                f"crashes the process). Received: {name.rsplit('.', 1)[-1]}{_describe(args, kwargs)} after it. "
                "Expected one strategy per process: the one built at the top of the script, reused everywhere.")
        init(self, *args, **kwargs)

    __init__.tfdist_once = True
    return __init__


def _across_workers() -> str | None:
    """What makes this process one task of several, in words (``tfdist.setup``'s cluster, or the script's first
    ``MultiWorkerMirroredStrategy`` across workers), or None."""
    from tfdist import _compat
    from tfdist.runtime import who

    current = who.current()
    if current is not None and not current.placement.task.is_local:
        return f"tfdist.setup's {current.runtime.strategy} as {current.placement.name}"
    made = _made.get("strategy")
    if made is not None and _compat.is_multi_worker(made):
        return "the script's first tf.distribute.MultiWorkerMirroredStrategy"
    return None


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
