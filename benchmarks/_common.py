"""What every benchmark script shares: one JSON object per result line."""

from __future__ import annotations

import json
from typing import Any


def emit(
    name: str, value: float, unit: str, target: str | None = None, *, digits: int = 3,
    **extra: Any,
) -> None:
    """Print one result: ``name``, ``value`` (rounded), ``unit``, ``target`` when set, extras."""
    row: dict[str, Any] = {"name": name, "value": round(value, digits), "unit": unit}
    if target is not None:
        row["target"] = target
    row.update(extra)
    print(json.dumps(row), flush=True)
