"""Frozen dataclass instances made on the hot path without their generated ``__init__``.

A frozen dataclass's ``__init__`` calls ``object.__setattr__`` once per field: for the
objects every message makes (its envelope, origin, apply result, disposition, each
delivery's ``Outbound`` and outbox ``Item``) that costs more than the work they describe
(about 1,500 instructions a field). ``maker`` sets the whole ``__dict__`` at once instead
(as the parser builds its results).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, TypeVar

_T = TypeVar("_T")
_new_object = object.__new__
_set_attribute = object.__setattr__


def maker(cls: type[_T]) -> Callable[..., _T]:
    """A function making instances of a frozen dataclass (one with a ``__dict__`` and no
    ``__post_init__``) from keyword values: the object ``cls(**values)`` makes, default
    factories called for the fields not given.

    A plain function, not an object with ``__call__``: calling an instance costs a
    method look-up and a bound call on top, as much again as the making itself.
    """
    if "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: only plain dataclasses with a __dict__")
    defaults: dict[str, Any] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for f in fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not MISSING:
            factories.append((f.name, f.default_factory))
        elif f.default is not MISSING:
            defaults[f.name] = f.default

    def make(**values: Any) -> _T:
        obj = _new_object(cls)
        _set_attribute(obj, "__dict__", {**defaults, **values})
        return obj

    if not factories:
        return make

    def make_with_factories(**values: Any) -> _T:
        made = {**defaults, **values}
        for name, factory in factories:
            if name not in values:
                made[name] = factory()
        obj = _new_object(cls)
        _set_attribute(obj, "__dict__", made)
        return obj

    return make_with_factories
