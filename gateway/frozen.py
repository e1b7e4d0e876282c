"""Frozen dataclass instances made on the hot path without their generated ``__init__``.

A frozen dataclass's ``__init__`` calls ``object.__setattr__`` once per field: for the few
objects every message makes (its origin, its disposition, each delivery's ``Outbound``
and outbox ``Item``) that costs more than the work they describe. ``maker`` sets the
whole ``__dict__`` at once instead (as the parser builds its results), and
``shared_address`` hands out one immutable ``Address`` per place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from functools import lru_cache
from typing import Any, TypeVar

from adapters.base import Address

_T = TypeVar("_T")
_new_object = object.__new__
_set_attribute = object.__setattr__


def maker(cls: type[_T]) -> Callable[..., _T]:
    """A function making instances of a frozen dataclass (one with a ``__dict__`` and no
    ``__post_init__``) from keyword values: the object ``cls(**values)`` makes.

    A plain function, not an object with ``__call__``: calling an instance costs a
    method look-up and a bound call on top, as much again as the making itself.
    """
    if "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: only plain dataclasses with a __dict__")
    defaults: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a default factory is not supported")
        if f.default is not MISSING:
            defaults[f.name] = f.default

    def make(**values: Any) -> _T:
        obj = _new_object(cls)
        _set_attribute(obj, "__dict__", {**defaults, **values})
        return obj

    return make


@lru_cache(maxsize=4096)
def shared_address(transport: str, channel: str, thread: str | None) -> Address:
    """``Address(transport, channel, thread or None)``, one shared object per place
    (bounded: places come from outside)."""
    return Address(transport, channel, thread or None)
