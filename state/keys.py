"""Key names for the per-transport, per-destination and per-agent keys.

The conversation records share one hash tag (``{namespace}``, docs/state.md). Newer keys
carry a hash tag of their own instead, so a Redis Cluster spreads them over its shards
while every atomic step still touches one slot: ``<namespace>:<kind>:{<tag>}`` where the
tag names the transport, destination or agent the key belongs to.
"""

from __future__ import annotations

import hashlib
import re

_PLAIN_TAG = re.compile(r"[A-Za-z0-9_.:@#/+=-]{1,100}")


def hash_tag(value: str) -> str:
    """``value`` as a Redis Cluster hash tag: itself when short and brace-free, else a digest.

    A ``}`` inside a tag would end it early and put unrelated keys on one slot; a very
    long name would make every key long. Both become a short digest.
    """
    if _PLAIN_TAG.fullmatch(value):
        return value
    return "h" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def tagged_key(namespace: str, kind: str, tag: str) -> str:
    """The key (or key prefix) ``<namespace>:<kind>:{<tag>}``."""
    return f"{namespace}:{kind}:{{{hash_tag(tag)}}}"
