"""The node agent against an API server that hangs or fails (docs/operator-guide/tenancy.md): a stopping
agent still removes what it published, within its bound, and the time it published is
refreshed so that a reader can tell a stale inventory."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from dsagent.nodeagent.clusteragent import ClusterSettings
from dsplatform.kubetime import parse
from tests.dsagent.nodeagent.test_cluster_agent import NODE, cluster_agent, node_annotations, node_cache, until
from tools.support.fake_apiserver import FakeApiServer, RecordedRequest, make_node

#: what an agent of the release before published on its Node: a stopping agent removes it too
LEGACY = {"dsagent.io/inventory": '{"datasets":{}}', "dsagent.io/published-at": "2020-01-01T00:00:00Z"}
NODECACHE = f"/apis/dsagent.io/v1alpha1/nodecaches/{NODE}"


def reads(request: RecordedRequest) -> bool:
    return request.method == "GET"


def test_a_stopping_agent_clears_its_annotations_while_reads_hang(apiserver: FakeApiServer, tmp_path: Path) -> None:
    """The API server answers writes but no reads (an overloaded watch cache): the agent
    removes its annotations without reading its Node first, and stops well within its bound
    though its pod watch hangs in a reconnect it cannot interrupt (it is left behind)."""
    apiserver.create(make_node(NODE, annotations={"unrelated": "kept"}))
    cluster = ClusterSettings(publish_interval=3600, watch_timeout=1, stop_timeout=8)
    took: list[float] = []

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=cluster) as agent:
            await until(lambda: agent.patches == 1, what="the first publish")
            assert "inventory" in node_cache(apiserver)
            apiserver.patch("nodes", NODE, {"metadata": {"annotations": LEGACY}})  # as an older agent left it
            agent._annotations = None  # as after a failed publish: what the Node carries is unknown
            hung = len(apiserver.requests_matching("GET", "/api/v1/pods"))
            apiserver.hang(reads)
            # the watch ends its 1 s stream and reconnects into the hang
            await until(lambda: len(apiserver.requests_matching("GET", "/api/v1/pods")) > hung, what="a hung read")
            started = time.monotonic()
        took.append(time.monotonic() - started)

    try:
        asyncio.run(scenario())
    finally:
        apiserver.heal()
    assert node_annotations(apiserver) == {"unrelated": "kept"}
    assert "inventory" not in node_cache(apiserver)
    assert took[0] < 5, took


def test_a_stopping_agent_retries_a_failing_api_server_until_it_answers(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.create(make_node(NODE))
    cluster = ClusterSettings(publish_interval=3600, watch_timeout=5, stop_timeout=8)

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=cluster) as agent:
            await until(lambda: agent.patches == 1, what="the first publish")
            apiserver.fail(lambda r: r.method == "PATCH", code=503)
            threading.Timer(1.0, apiserver.heal).start()  # the API server comes back a second later

    asyncio.run(scenario())
    assert node_annotations(apiserver) == {} and "inventory" not in node_cache(apiserver)
    failed = [r for r in apiserver.requests_matching("PATCH", NODECACHE)]
    assert len(failed) >= 3  # the first publish (404: then created), at least one refused emptying, the emptying
    assert apiserver.requests_matching("PATCH", f"/api/v1/nodes/{NODE}")  # and the Node's annotations


def test_a_stopping_agent_gives_up_at_its_bound_when_the_api_server_hangs(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.create(make_node(NODE))
    cluster = ClusterSettings(publish_interval=3600, watch_timeout=5, stop_timeout=2)
    took: list[float] = []

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=cluster) as agent:
            await until(lambda: agent.patches == 1, what="the first publish")
            apiserver.hang()
            started = time.monotonic()
        took.append(time.monotonic() - started)

    try:
        asyncio.run(scenario())
    finally:
        apiserver.heal()
    assert took[0] < 2 + 1.5, took  # the bound, plus the service's own stop


def test_the_published_time_is_refreshed_at_the_heartbeat_without_a_change(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.create(make_node(NODE))
    cluster = ClusterSettings(publish_interval=0.05, watch_timeout=5, publish_heartbeat=1.0)

    async def scenario() -> None:
        async with cluster_agent(apiserver, tmp_path, cluster=cluster) as agent:  # a fixed capacity: see CAPACITY
            await until(lambda: agent.patches >= 1, what="the first publish")
            first = parse(node_cache(apiserver)["publishedAt"])

            def beats() -> list[Any]:  # patches of the time alone: the inventory did not change
                return [
                    r
                    for r in apiserver.requests_matching("PATCH", NODECACHE)
                    if set(r.body["status"]) == {"publishedAt"}
                ]

            await until(lambda: len(beats()) >= 2, timeout=10, what="two heartbeats")
            later = parse(node_cache(apiserver)["publishedAt"])
            assert later >= first + 1
            assert agent.patches <= 12  # not every interval: at the heartbeat

    asyncio.run(scenario())
