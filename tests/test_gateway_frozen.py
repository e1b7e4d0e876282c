"""state.frozen and gateway.frozen: objects made without their dataclass __init__ are the
same objects."""

from __future__ import annotations

import dataclasses
import time

import pytest

from adapters.base import Address, Author, Disposition, Envelope, Outbound
from gateway.frozen import shared_address
from state.frozen import maker
from state.records import ApplyResult, Origin, Outcome


@pytest.mark.parametrize(
    ("cls", "values"),
    [
        (Origin, {"transport": "http", "channel": "Lotbot", "thread": None, "native_id": "n1"}),
        (Disposition, {"outcome": "accepted", "detail": "applied", "request_ids": ("r-1",),
                       "warnings": ({"code": "no_address"},)}),
        (Outbound, {"address": Address("side", "room", "t"), "text": "hi", "id": "1-2"}),
        (ApplyResult, {"outcome": Outcome.APPLIED, "reason": "", "source": None,
                       "previous_status": None}),
        (Envelope, {"transport": "http", "channel": "Lotbot", "author": Author("Lotbot"),
                    "text": "hi", "native_id": "n1", "at": 1.5}),
    ],
)
def test_a_made_object_is_what_the_constructor_makes(cls: type, values: dict) -> None:
    made = maker(cls)(**values)
    expected = cls(**values)
    assert type(made) is cls and made == expected and repr(made) == repr(expected)
    if cls is not Disposition:  # (its warnings are dicts: not hashable either way)
        assert hash(made) == hash(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.detail = "changed"
    field = dataclasses.fields(cls)[0].name
    assert dataclasses.replace(made, **{field: "x"}) == dataclasses.replace(expected,
                                                                           **{field: "x"})


def test_a_default_factory_makes_the_fields_not_given() -> None:
    """Envelope.at: made per object by its factory, as the constructor does."""
    before = time.time()
    made = maker(Envelope)(transport="http", channel="Lotbot", author=Author("Lotbot"),
                           text="hi")
    assert before <= made.at <= time.time()
    assert made == Envelope("http", "Lotbot", Author("Lotbot"), "hi", at=made.at)


def test_a_maker_refuses_what_the_constructor_refuses() -> None:
    """A keyword that is no field, or a field without a default left out: TypeError, as
    ``cls(**values)`` raises (the maker has one keyword-only parameter per field)."""
    make = maker(Origin)
    with pytest.raises(TypeError, match="unexpected keyword argument 'chanel'"):
        make(transport="http", chanel="Lotbot")
    with pytest.raises(TypeError, match="channel"):
        make(transport="http")
    with pytest.raises(TypeError):
        make("http", "Lotbot")  # keywords only


def test_a_made_object_holds_the_constructors_defaults() -> None:
    """Fields left out get the very default objects the constructor gives, every field
    is in the instance's dict, and each object gets its own factory-made value."""
    made = maker(Disposition)(outcome="ignored")
    expected = Disposition("ignored")
    assert vars(made) == vars(expected) and list(vars(made)) == list(vars(expected))
    for f in dataclasses.fields(Disposition):
        assert getattr(made, f.name) is getattr(expected, f.name)
    make = maker(_Counted)
    first = make().serial
    assert [make().serial, make(serial=0).serial, make(name="x")] == [
        first + 1, 0, _Counted(name="x", serial=first + 2)]


def test_a_class_the_maker_can_not_make_is_refused() -> None:
    """A class with __slots__ (no __dict__ to set) is refused when the maker is made."""
    with pytest.raises(TypeError, match="only plain dataclasses"):
        maker(_Slotted)


@dataclasses.dataclass(frozen=True, slots=True)
class _Slotted:
    value: int


_serials = iter(range(1, 100))


@dataclasses.dataclass(frozen=True)
class _Counted:
    name: str = ""
    serial: int = dataclasses.field(default_factory=lambda: next(_serials))


def test_shared_address_is_one_object_per_place() -> None:
    a = shared_address("side", "room", "")
    assert a == Address("side", "room", None) and a is shared_address("side", "room", "")
    assert shared_address("side", "room", "t") == Address("side", "room", "t")
