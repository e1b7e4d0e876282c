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
from keyword import iskeyword
from typing import Any, TypeVar

_T = TypeVar("_T")
_new_object = object.__new__
_set_attribute = object.__setattr__


def maker(cls: type[_T]) -> Callable[..., _T]:
    """A function making instances of a frozen dataclass (one with a ``__dict__`` and no
    ``__post_init__``) from keyword values: the object ``cls(**values)`` makes, default
    factories called for the fields not given; a keyword that is no field, or a field
    without a default left out, raises TypeError as the constructor does.

    A plain function with one keyword-only parameter per field, written for ``cls`` (as
    dataclasses writes ``__init__``): its values bound to parameters and put in one dict
    display cost about 1,500 instructions less than a ``**values`` dict merged into a
    copy of the defaults. Not an object with ``__call__``: calling an instance costs a
    method look-up and a bound call on top, as much again as the making itself.
    """
    if "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: only plain dataclasses with a __dict__")
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if not all(n.isidentifier() and not iskeyword(n) and not n.startswith("_m_")
               for n in names):
        raise TypeError(f"{cls.__name__}: field names the maker can not write")
    scope: dict[str, Any] = {"_m_cls": cls, "_m_new": _new_object, "_m_set": _set_attribute,
                             "_m_missing": MISSING}
    params: list[str] = []
    made: list[str] = []
    for i, f in enumerate(fields(cls)):  # type: ignore[arg-type]
        if f.default_factory is not MISSING:  # called only when the field is not given
            scope[f"_m_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_m_missing")
            made.append(f"    if {f.name} is _m_missing:\n"
                        f"        {f.name} = _m_factory{i}()\n")
        elif f.default is not MISSING:  # (the same object as the constructor's default)
            scope[f"_m_default{i}"] = f.default
            params.append(f"{f.name}=_m_default{i}")
        else:
            params.append(f.name)
    source = (f"def make(*, {', '.join(params)}):\n{''.join(made)}"
              "    obj = _m_new(_m_cls)\n"
              f"    _m_set(obj, '__dict__', {{{', '.join(f'{n!r}: {n}' for n in names)}}})\n"
              "    return obj\n")
    exec(source, scope)  # (field names checked above: plain identifiers only)
    make: Callable[..., _T] = scope["make"]
    make.__qualname__ = f"maker({cls.__qualname__})"
    return make
