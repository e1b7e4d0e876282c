"""Frozen dataclass instances made on the hot path without their generated ``__init__``.

A frozen dataclass's ``__init__`` calls ``object.__setattr__`` once per field: for the few
objects every message makes (its origin, its disposition, each delivery's ``Outbound``
and outbox ``Item``) that costs more than the work they describe. ``Maker`` sets the
whole ``__dict__`` at once instead (as the parser builds its results), and
``shared_address`` hands out one immutable ``Address`` per place.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from functools import lru_cache
from typing import Any, Generic, TypeVar

from adapters.base import Address

_T = TypeVar("_T")
_new_object = object.__new__
_set_attribute = object.__setattr__


class Maker(Generic[_T]):
    """Makes instances of a frozen dataclass (one with a ``__dict__`` and no
    ``__post_init__``) from keyword values: the object ``cls(**values)`` makes."""

    def __init__(self, cls: type[_T]) -> None:
        if "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
            raise TypeError(f"{cls.__name__}: only plain dataclasses with a __dict__")
        self._cls = cls
        self._defaults: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.default_factory is not MISSING:
                raise TypeError(f"{cls.__name__}.{f.name}: a default factory is not supported")
            if f.default is not MISSING:
                self._defaults[f.name] = f.default

    def __call__(self, **values: Any) -> _T:
        obj = _new_object(self._cls)
        _set_attribute(obj, "__dict__", {**self._defaults, **values})
        return obj


@lru_cache(maxsize=4096)
def shared_address(transport: str, channel: str, thread: str | None) -> Address:
    """``Address(transport, channel, thread or None)``, one shared object per place
    (bounded: places come from outside)."""
    return Address(transport, channel, thread or None)
