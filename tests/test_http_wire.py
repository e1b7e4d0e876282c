"""The HTTP transport's answers, byte for byte, to a corpus of raw requests
(tests/http_wire.py): good, malformed, pipelined, chunked, compressed, oversize, slow,
odd methods and targets. ``tests/vectors/http_wire.json`` holds the expected answers.

They were recorded from the aiohttp-based server this transport ran on until 2026-12,
and are unchanged for clients but in these cases (the new server's answers are recorded):

- malformed requests (a bad request line, header, Content-Length, chunk size, a missing
  Host on HTTP/1.1, a head over the bounds): 400 in the API's JSON error shape with
  ``Connection: close``, where aiohttp answered ``HTTP/1.0 400`` in plain text; a request
  head over 64 KiB (``huge_head``) is one of them (aiohttp bounded only each field);
- ``pipelined_with_error_in_middle``: the requests before the malformed one are answered
  first (aiohttp dropped them);
- ``post_gzip_bad`` (a body that is not the gzip it claims): 400, not a logged 503;
  ``post_br``: 400 in the JSON shape;
- no ``Server`` header (it named aiohttp and Python's versions; nothing relies on it);
- cases aiohttp took, refused 400 since as ambiguous (another server on the way could
  read them otherwise): a second ``Host``, ``Authorization``, ``Content-Type`` or
  ``Content-Encoding`` (``duplicate_auth``), a ``Transfer-Encoding`` other than
  ``chunked`` or on HTTP/1.0 (``te_unknown``'s message changed with it); trailer fields
  are never taken as headers (``trailer_not_a_header``) and are bounded as a head is
  (``trailer_endless``);
- the answer to a request after which the server reads nothing more (``connect_method``,
  ``upgrade_websocket``) says ``Connection: close``, as the connection closes after it;
- ``Expect: 100-continue``: a request refused before its body is read (``expect_continue_*``
  with a 4xx) gets no ``100 Continue`` first, and its answer says ``Connection: close``.

The ``eof_*`` cases (a half-close after or inside requests) were recorded from this
server only.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from http_wire import CASES, answers, serving

VECTORS = Path(__file__).parent / "vectors" / "http_wire.json"

pytestmark = pytest.mark.redis


@pytest.fixture
async def found(redis_url: str, namespace: str, redis_client: Any
                ) -> AsyncIterator[dict[str, str]]:
    """Every case's answer from a running transport (cases run at once, each on its own
    connection; the slowest ends with the 1 s timeouts)."""
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        async with serving(client, namespace) as adapter:
            yield await answers(adapter)
    finally:
        await client.aclose()


async def test_every_answer_is_as_recorded(found: dict[str, str]) -> None:
    expected = json.loads(VECTORS.read_text())
    assert set(expected) == set(CASES)
    wrong = {name: (expected[name], found[name]) for name in CASES
             if found[name] != expected[name]}
    assert not wrong, json.dumps(wrong, indent=1)


async def test_no_answer_is_a_500_nor_names_the_server(found: dict[str, str]) -> None:
    for name, answer in found.items():
        assert re.search(r"HTTP/1\.[01] 5(?!03)", answer) is None, name
        assert "\r\nServer:" not in answer, name
