"""Transport kind ``http``: a local HTTP API for agents and operators (docs/http-api.md)."""

from __future__ import annotations

from adapters.base import register_adapter
from adapters.http.server import HttpAdapter

register_adapter("http")(HttpAdapter)

__all__ = ["HttpAdapter"]
