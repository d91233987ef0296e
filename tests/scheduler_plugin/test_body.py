"""Request bodies received into reused buffers: exact bytes, bounded memory, never shared."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx

from scheduler_plugin.app import create_app
from scheduler_plugin.body import BodyBuffers
from scheduler_plugin.settings import Settings
from scheduler_plugin.testing import (
    args_body,
    holding,
    inventory_json,
    node,
    pod,
    topology_json,
)
from tests.scheduler_plugin.server import serving


def read(buffers: BodyBuffers, chunks: Sequence[bytes]) -> tuple[bytearray | None, int]:
    """Read one body delivered as ``chunks``; also how many messages were consumed."""
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    consumed = 0

    async def receive() -> dict[str, Any]:
        nonlocal consumed
        consumed += 1
        return messages[consumed - 1]

    return asyncio.run(buffers.read(receive)), consumed


def test_a_body_is_the_exact_concatenation_of_its_chunks() -> None:
    body, _ = read(BodyBuffers(1 << 20), [b"ab", b"", b"cde", b"f"])
    assert body == bytearray(b"abcdef")
    assert read(BodyBuffers(1 << 20), [b""])[0] == bytearray()


def test_a_buffer_given_back_is_reused_for_shorter_and_longer_bodies() -> None:
    buffers = BodyBuffers(1 << 20)
    first, _ = read(buffers, [b"x" * 1000, b"y" * 1000])
    assert first is not None
    buffers.give_back(first)
    shorter, _ = read(buffers, [b"short"])
    assert shorter is first and shorter == bytearray(b"short")
    buffers.give_back(shorter)
    longer, _ = read(buffers, [b"a" * 3000, b"b"])
    assert longer is first and longer == bytearray(b"a" * 3000 + b"b")


def test_a_body_over_the_limit_is_none_and_still_drained() -> None:
    body, consumed = read(BodyBuffers(10), [b"12345", b"67890", b"1", b"2"])
    assert body is None and consumed == 4
    body, _ = read(BodyBuffers(10), [b"12345", b"67890"])
    assert body == bytearray(b"1234567890")


def test_a_buffer_still_viewed_is_not_kept() -> None:
    buffers = BodyBuffers(1 << 20)
    body, _ = read(buffers, [b"payload"])
    assert body is not None
    view = memoryview(body)[1:3]
    buffers.give_back(body)
    again, _ = read(buffers, [b"other"])
    assert again is not body and bytes(view) == b"ay"


def test_at_most_keep_buffers_are_kept() -> None:
    buffers = BodyBuffers(1 << 20, keep=1)
    a, _ = read(buffers, [b"a"])
    b, _ = read(buffers, [b"b"])
    assert a is not None and b is not None and a is not b
    buffers.give_back(a)
    buffers.give_back(b)
    assert read(buffers, [b"c"])[0] is a
    assert read(buffers, [b"d"])[0] is not b


def test_requests_of_changing_sizes_on_one_connection_score_as_on_a_fresh_server() -> None:
    topology = topology_json()
    cluster = [
        node(
            f"n{i}",
            inventory=inventory_json(datasets={"imagenet": holding()} if i % 2 else {}),
            topology=topology,
            free_gpus=[0, 1, 2, 3][: i % 4 + 1],
            resource_version=str(i + 1),
        )
        for i in range(40)
    ]
    wants = [{"name": "imagenet", "source": "s3://d/imagenet"}]
    bodies = [
        args_body(pod(f"p{size}", datasets=wants, gpus=1), cluster[:size], node_cache_capable=False)
        for size in (40, 3, 25, 40, 1)
    ]
    expected = []
    for body in bodies:
        with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
            expected.append((http.post("/prioritize", content=body).json(), http.post("/filter", content=body).json()))
    with serving(create_app(Settings())) as url, httpx.Client(base_url=url, timeout=30) as http:
        got = [
            (http.post("/prioritize", content=body).json(), http.post("/filter", content=body).json())
            for body in bodies
        ]
    assert got == expected
    assert [len(p) for p, _ in got] == [40, 3, 25, 40, 1]
    assert got[0][1]["Nodes"]["items"] == cluster


def asgi_post(app: Any, path: str, body: bytes) -> list[dict[str, Any]]:
    """POST ``body`` to the ASGI ``app`` in one message; every message it sends back."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            await asyncio.Event().wait()  # nothing more: the app must not read past the body
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"", "headers": []}
    asyncio.run(app(scope, receive, send))
    return sent


def test_a_filter_reply_is_sent_a_batch_at_a_time_and_equals_the_whole_reply() -> None:
    """The reply echoing ~48 MiB of passing nodes was one bytes object (after a
    join, then a concatenation), copied again by the HTTP writer and into the socket's
    buffer; it is now sent in batches of ~1 MiB joined from views of the request body."""
    from scheduler_plugin.app import REPLY_BATCH_BYTES

    topology = topology_json()
    cluster = [
        node(f"n{i}", inventory=inventory_json(datasets={"imagenet": holding()}), topology=topology, free_gpus=[0, 1])
        for i in range(1200)
    ]
    body = args_body(pod(gpus=1), cluster, node_cache_capable=False)
    app = create_app(Settings())
    sent = asgi_post(app, "/filter", body)
    start, chunks = sent[0], [m["body"] for m in sent[1:]]
    assert start["status"] == 200 and all(m["type"] == "http.response.body" for m in sent[1:])
    reply = b"".join(chunks)
    assert reply == app.filter(body)  # the same bytes as the reply made whole
    assert int(dict(start["headers"])[b"content-length"]) == len(reply)
    assert len(reply) > 4 * REPLY_BATCH_BYTES and len(json.loads(reply)["Nodes"]["items"]) == 1200
    largest_node = max(len(json.dumps(n, separators=(",", ":"))) for n in cluster)
    assert max(map(len, chunks)) <= REPLY_BATCH_BYTES + largest_node, "a batch holds more than ~1 MiB"
    assert [m.get("more_body", False) for m in sent[1:]] == [True] * (len(chunks) - 1) + [False]
