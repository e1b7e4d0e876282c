"""Validated options: one way to turn pydantic's errors into sentences naming the key.

The gateway's configuration (``gateway/config.py``) and every transport's options model
(``load_options``) report problems the same way: ``invalid configuration: `` followed by
one ``dotted.key: reason`` per problem, an unknown key as ``unknown key gateway.log_levle
(did you mean log_level?)``. HTTP request bodies reuse the wording without the prefix.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from adapters.base import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)

# Values of keys whose name contains one of these are never echoed in an error.
_SECRET_WORDS = ("token", "secret", "password", "key")
_ECHO_CHARS = 60


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X`` (the first non-None member of a union)."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        return members[0] if members else annotation
    return annotation


def field_type(model: type[BaseModel], path: Sequence[str | int]) -> Any:
    """The annotation of the value at ``path`` under ``model`` (None when unknown).

    Walks model fields, dict values (any key) and list items, so ``("agents", "Bot",
    "addresses")`` of the gateway config is ``list[str]``.
    """
    current: Any = model
    for part in path:
        current = _unwrap(current)
        origin = get_origin(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif origin is dict:
            current = get_args(current)[1]
        elif origin is list and isinstance(part, int):
            current = get_args(current)[0]
        else:
            return None
    return _unwrap(current)


def _known_keys(model: type[BaseModel] | None, loc: Sequence[str | int]) -> list[str]:
    parent = field_type(model, loc[:-1]) if model is not None else None
    if isinstance(parent, type) and issubclass(parent, BaseModel):
        return list(parent.model_fields)
    return []


def _unknown_key(key: str, name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"unknown key {key} (did you mean {close[0]}?)"
    if known:
        return f"unknown key {key} (known: {', '.join(known)})"
    return f"unknown key {key}"


def _echo(key: str, value: Any) -> str:
    """`` (got 'lots')`` for a scalar input of a key that holds no secret, else ""."""
    if isinstance(value, Mapping | list) or any(w in key.lower() for w in _SECRET_WORDS):
        return ""
    text = repr(value)
    if len(text) > _ECHO_CHARS:
        text = text[: _ECHO_CHARS - 1] + "…"
    return f" (got {text})"


def describe_validation_error(
    exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None
) -> str:
    """One ``key: reason`` per problem, joined by ``; ``, each key dotted under ``prefix``.

    ``model`` (the validated model) lets an unknown key suggest the closest known one.
    """
    problems = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        key = ".".join(str(part) for part in (prefix, *loc) if part != "")
        if error["type"] == "extra_forbidden" and loc:
            problems.append(_unknown_key(key, str(loc[-1]), _known_keys(model, loc)))
            continue
        reason = error["msg"]
        if error["type"] in ("value_error", "assertion_error"):
            reason = str(error.get("ctx", {}).get("error", reason))
            # A ConfigError raised in a validator: the prefix is said once, in front.
            reason = reason.removeprefix(ConfigError.PREFIX)
        elif error["type"] != "missing":
            reason += _echo(key, error.get("input"))
        problems.append(f"{key}: {reason}" if key else reason)
    return "; ".join(problems)


class TransportOptions(dict[str, Any]):
    """A transport's options as the gateway hands them to its factory: a plain dict that
    also knows ``config_dir``, the folder of the config file they came from (None without
    a file). `load_options` resolves relative path options against it."""

    def __init__(self, values: Mapping[str, Any], config_dir: Path | None = None) -> None:
        super().__init__(values)
        self.config_dir = config_dir


def _relative_to(model: type[BaseModel], values: dict[str, Any], folder: Path) -> None:
    """Options typed ``Path`` given as relative paths become relative to ``folder``."""
    for key, value in values.items():
        if isinstance(value, str) and value and field_type(model, (key,)) is Path:
            values[key] = str(folder / Path(value).expanduser())


def load_options(model: type[ModelT], name: str, options: Mapping[str, Any] | None) -> ModelT:
    """Validate a transport's ``options`` mapping; raise ``ConfigError`` naming the key.

    Options from a config file (`TransportOptions` with a ``config_dir``) that are typed
    ``Path`` and relative are taken relative to the config file's folder.
    """
    values = dict(options or {})
    folder = getattr(options, "config_dir", None)
    if isinstance(folder, Path):
        _relative_to(model, values, folder)
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"transports.{name}", model)) from None
