"""The Nodes kept by list+watch (dsagent/kube/nodewatch.py), against the fake API server over
real HTTP with the official client: the same Nodes a list gives, through every kind of change."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dsagent.kube import nodestate
from dsagent.kube.nodewatch import NodeWatch
from tools.support.fake_apiserver import FakeApiServer, make_node, make_nodecache


def listed(server: FakeApiServer) -> dict[str, Any]:
    """name -> the Node as a list overlays it, less what the watch does not keep."""
    from kubernetes import client

    api = server.api_client()
    try:
        nodes = nodestate.list_nodes(client.CoreV1Api(api), client.CustomObjectsApi(api), timeout=10)
    finally:
        api.close()
    out = {}
    for node in nodes:
        meta = {k: v for k, v in node["metadata"].items() if k != "managedFields"}
        status = {k: v for k, v in (node.get("status") or {}).items() if k != "images"}
        out[meta["name"]] = {**node, "metadata": meta, "status": status}
    return out


def watched(watch: NodeWatch) -> dict[str, Any]:
    return {n["metadata"]["name"]: n for n in watch.nodes()}


def inventory(*names: str) -> str:
    import json

    return json.dumps({"datasets": {n: {"digest": "a" * 32, "state": "ready", "sizeBytes": 10} for n in names}})


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as fake:
        for i in range(4):
            node = make_node(f"n{i}", annotations={"dsagent.io/inventory": inventory("old")})
            node["status"]["images"] = [{"names": [f"registry.example/big:{j}"], "sizeBytes": 10**9} for j in range(50)]
            fake.create(node)
        uid = fake.get("nodes", "n0")["metadata"]["uid"]  # type: ignore[index]
        fake.create(make_nodecache("n0", inventory=inventory("imagenet"), node_uid=uid))
        yield fake


@pytest.fixture
def watch(server: FakeApiServer) -> Iterator[NodeWatch]:
    api = server.api_client()
    nw = NodeWatch(api, retry_s=0.05, watch_timeout_s=30, page_size=2)  # lists in pages
    nw.start()
    assert nw.wait_synced(10)
    # listed, and both watches open: a fault or a closing set from here on meets them
    server.wait_for(lambda: server.open_watches == 2, what="both watches open")
    yield nw
    nw.stop()
    api.close()


def test_the_watched_nodes_are_those_a_list_gives_through_random_changes(
    server: FakeApiServer, watch: NodeWatch
) -> None:
    assert watched(watch) == listed(server)
    first = watched(watch)
    assert all("images" not in n["status"] for n in first.values())  # kept slim
    assert "imagenet" in first["n0"]["metadata"]["annotations"]["dsagent.io/inventory"]  # its NodeCache, overlaid
    rng = random.Random(5)
    for step in range(40):
        names = sorted(n["metadata"]["name"] for n in server.list("nodes"))
        roll = rng.random()
        name = rng.choice(names) if names else None
        if roll < 0.2 or name is None:
            server.create(make_node(f"new{step}", annotations={"dsagent.io/inventory": inventory("x")}))
        elif roll < 0.35:
            server.delete("nodes", name)  # its NodeCache goes with it
        elif roll < 0.6:
            server.patch("nodes", name, {"metadata": {"annotations": {"dsagent.io/inventory": inventory(f"d{step}")}}})
        elif server.get("nodecaches", name) is None:
            uid = server.get("nodes", name)["metadata"]["uid"]  # type: ignore[index]
            server.create(make_nodecache(name, inventory=inventory(f"c{step}"), node_uid=uid))
        elif roll < 0.9:
            server.patch("nodecaches", name, {"status": {"inventory": inventory(f"c{step}")}})
        else:
            server.delete("nodecaches", name)  # the Node's own annotation again
        server.wait_for(lambda: watched(watch) == listed(server), what=f"the watch after step {step}")
    assert watch.events > 0


def test_a_node_s_dict_is_replaced_not_changed_so_a_pass_keeps_what_it_read(
    server: FakeApiServer, watch: NodeWatch
) -> None:
    before = watch.nodes()
    kept = {n["metadata"]["name"]: repr(n) for n in before}
    server.patch("nodecaches", "n0", {"status": {"inventory": inventory("changed")}})
    server.wait_for(lambda: "changed" in watched(watch)["n0"]["metadata"]["annotations"]["dsagent.io/inventory"])
    assert {n["metadata"]["name"]: repr(n) for n in before} == kept


def test_an_expired_watch_lists_again_and_keeps_up(
    server: FakeApiServer, watch: NodeWatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dsagent.kube.nodewatch")
    lists = len(server.requests_matching("GET", "/api/v1/nodes", watch=False))
    server.compact()
    server.close_watches()
    server.wait_for(lambda: len(server.requests_matching("GET", "/api/v1/nodes", watch=False)) > lists, what="a list")
    server.create(make_node("after-410"))
    server.wait_for(lambda: "after-410" in watched(watch), what="the node made after 410 Gone")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "dsagent.kube.nodewatch"]
    assert (logging.INFO, "watch of nodes expired (410 Gone); listing again") in said
    assert not [m for level, m in said if level >= logging.WARNING]  # an expiry, not a failure
    assert watched(watch) == listed(server)
    assert all(
        w.query.get("allowWatchBookmarks") == "true"
        for w in server.requests_matching("GET", "/api/v1/nodes", watch=True)
    )


def test_without_the_nodecache_crd_the_nodes_alone_and_its_arrival_is_noticed(server: FakeApiServer) -> None:
    absent = True
    server.fail(lambda r: absent and "nodecaches" in r.path, code=404)
    api = server.api_client()
    nw = NodeWatch(api, retry_s=0.05, absent_retry_s=0.2, watch_timeout_s=30)
    nw.start()
    try:
        assert nw.wait_synced(10)  # the CRD's absence is an answer: the Nodes alone
        assert "old" in watched(nw)["n0"]["metadata"]["annotations"]["dsagent.io/inventory"]
        absent = False
        server.heal()
        server.wait_for(lambda: "imagenet" in watched(nw)["n0"]["metadata"]["annotations"]["dsagent.io/inventory"])
    finally:
        nw.stop()
        api.close()


def test_it_stops_at_once_while_its_watches_wait(server: FakeApiServer) -> None:
    api = server.api_client()
    nw = NodeWatch(api, watch_timeout_s=300)
    nw.start()
    assert nw.wait_synced(10)
    server.wait_for(lambda: len(server.requests_matching("GET", "/api/v1/nodes", watch=True)) > 0, what="a watch")
    started = time.monotonic()
    nw.stop(timeout=60)
    assert time.monotonic() - started < 20  # at once, not after the watch's 300 s (nor the 60 s join)
    api.close()


def test_while_a_watch_fails_it_is_not_synced_so_a_reader_lists_for_itself(
    server: FakeApiServer, watch: NodeWatch
) -> None:
    server.fail(lambda r: r.is_watch, code=403)  # say, a ClusterRole without the watch verb
    server.close_watches()
    server.wait_for(lambda: not watch.synced, what="the watch failing")
    # each try lists again and succeeds, then its watch fails: a list alone is not a live watch
    lists = len(server.requests_matching("GET", "/api/v1/nodes", watch=False))
    seen, deadline = set(), time.monotonic() + 30
    while len(server.requests_matching("GET", "/api/v1/nodes", watch=False)) < lists + 6:
        assert time.monotonic() < deadline, "the watch is not tried again"
        seen.add(watch.synced)
    assert seen == {False}
    server.create(make_node("meanwhile"))
    server.heal()
    server.wait_for(lambda: watch.synced and "meanwhile" in watched(watch), what="the watch back")
    assert watched(watch) == listed(server)


def test_a_reader_of_some_published_fields_keeps_only_those(server: FakeApiServer) -> None:
    """The webhook's class vote reads the topology alone: the inventories (up to 64 KiB a
    node) are not kept, neither a NodeCache's nor an older agent's Node annotation."""
    from dsplatform import published

    uid = server.get("nodes", "n1")["metadata"]["uid"]  # type: ignore[index]
    server.create(make_nodecache("n1", inventory=inventory("x"), topology='{"t": 1}', node_uid=uid))
    api = server.api_client()
    nw = NodeWatch(api, retry_s=0.05, watch_timeout_s=30, published=(published.TOPOLOGY,))
    nw.start()
    try:
        assert nw.wait_synced(10)
        full = listed(server)
        for name, node in watched(nw).items():
            want = {k: v for k, v in full[name]["metadata"]["annotations"].items() if k != published.INVENTORY}
            want.pop(published.PUBLISHED_AT, None)
            assert node["metadata"]["annotations"] == want, name
        assert watched(nw)["n1"]["metadata"]["annotations"][published.TOPOLOGY] == '{"t": 1}'
        assert published.INVENTORY not in watched(nw)["n2"]["metadata"]["annotations"]  # an older agent's Node
        server.patch("nodecaches", "n1", {"status": {"topology": '{"t": 2}'}})
        server.wait_for(lambda: watched(nw)["n1"]["metadata"]["annotations"][published.TOPOLOGY] == '{"t": 2}')
        assert published.INVENTORY not in watched(nw)["n1"]["metadata"]["annotations"]
    finally:
        nw.stop()
        api.close()
