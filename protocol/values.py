"""Reading enum and depth values from their text form (wire input and builder arguments).

Each function raises ``ValueError`` with a sentence a person can act on.
"""

from __future__ import annotations

from protocol.models import MAX_DEPTH_LIMIT, STATUS_ALIASES, Depth, Priority, Status

_STATUSES = {status.value: status for status in Status} | STATUS_ALIASES
_PRIORITIES = {priority.value: priority for priority in Priority}


def parse_status(text: str | Status) -> Status:
    """``done``/``partial``/``failed``/``cancelled`` or an alias (``success`` ...), any case."""
    status = _STATUSES.get(str(text).strip().lower())
    if status is None:
        raise ValueError(
            f"Status {str(text)[:40]!r} is not one of done, partial, failed, cancelled "
            "(success, partial_success and canceled are accepted too)"
        )
    return status


def parse_priority(text: str | Priority, what: str = "Priority") -> Priority:
    """``low``/``normal``/``high``/``critical``, any case."""
    priority = _PRIORITIES.get(str(text).strip().lower())
    if priority is None:
        raise ValueError(f"{what} {str(text)[:40]!r} is not one of low, normal, high, critical")
    return priority


# Depth values are immutable; the canonical spellings (at most 1275) are built once.
_DEPTHS: dict[str, Depth] = {}


def parse_depth(text: str | Depth) -> Depth:
    """``current/max`` with ASCII digits and 1 <= current <= max <= 50."""
    if isinstance(text, Depth):
        return text
    cached = _DEPTHS.get(text)
    if cached is not None:
        return cached
    current, slash, maximum = text.partition("/")
    current, maximum = current.strip(), maximum.strip()
    if not (
        slash
        and current.isascii()
        and current.isdigit()
        and maximum.isascii()
        and maximum.isdigit()
        and len(current) <= 3
        and len(maximum) <= 3
    ):
        raise ValueError(f"Depth {text[:40]!r} is not of the form current/max, e.g. 1/5")
    low, high = int(current), int(maximum)
    if not 1 <= low <= high <= MAX_DEPTH_LIMIT:
        raise ValueError(
            f"Depth {low}/{high} must satisfy 1 <= current <= max <= {MAX_DEPTH_LIMIT}"
        )
    depth = Depth(current=low, max=high)
    if text == str(depth):
        _DEPTHS[text] = depth
    return depth
