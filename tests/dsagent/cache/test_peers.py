"""Peer-to-peer bundles with real agents and real HTTP on 127.0.0.1 (docs/design.md#peers).

A store served by :class:`LoopbackServer` (which counts GETs), agents run as real
``dsagent serve`` processes on TCP, and misbehaving peers as small HTTP servers here: one
that lies (wrong bytes), one that dies mid-stream, one that stalls. Whatever a peer does,
the fetching agent ends with the dataset verified, from the store where the peer failed.
"""

from __future__ import annotations

import http.server
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.cache.peers import (
    PeerBusy,
    PeerOverloaded,
    UploadLimits,
)
from dsagent.format.bundles.bundle import pack, verify_tree
from dsagent.format.bundles.extract import unpack_bundle_stream
from dsagent.format.manifest import Manifest, bundle_path
from tests.dsagent.conftest import write_tree
from tools.support.harness import AgentProcess, LoopbackServer, held_ports, wait_ready

pytest.importorskip("aiohttp")

TOKEN = "peer-token-0123456789abcdef"
FILES = {f"class{i % 3}/img{i:03d}.jpg": bytes([i % 251]) * (3000 + 97 * i) for i in range(24)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Manifest, LoopbackServer]]:
    """The dataset ``imgs`` packed into 6 bundles in a store served over HTTP."""
    www = tmp_path / "www"
    write_tree(www / "src", FILES)
    manifest = pack(www / "src", www / "store", name="imgs", max_files=4)
    assert len(manifest.bundles) >= 4
    server = LoopbackServer(www)
    yield manifest, server
    server.close()


def _bundle_gets(server: LoopbackServer) -> int:
    return sum(server.gets(lambda p: "/store/bundles/" in p).values())


def _cache(agent: AgentProcess, server: LoopbackServer, task: str = "t1") -> dict[str, Any]:
    with agent.client() as client:
        client.submit_task(task, [{"name": "imgs", "source": f"{server.url}/src", "bundles": f"{server.url}/store"}])
        record = wait_ready(client, task)
    assert record["state"] == "ready", record
    return record


def _peer_env(*peers: str, **extra: str) -> dict[str, str]:
    return {"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_PEERS": ",".join(peers), **extra}


def _metric(agent: AgentProcess, direction: str) -> float:
    with agent.client() as client:
        text = client.metrics()
    for line in text.splitlines():
        if line.startswith(f'dsplatform_agent_peer_bytes_total{{direction="{direction}"}}'):
            return float(line.split()[-1])
    return 0.0


def _verified(agent: AgentProcess, manifest: Manifest, record: dict[str, Any]) -> None:
    verify_tree(Path(record["datasets"][0]["path"]), manifest)


@pytest.fixture
def seeded(store: tuple[Manifest, LoopbackServer], agent_factory: Any) -> tuple[Manifest, LoopbackServer, AgentProcess]:
    """Agent ``a`` holds ``imgs`` ready, fetched from the store."""
    manifest, server = store
    a = agent_factory("a", tcp=True, env=_peer_env())
    _cache(a, server)
    assert _bundle_gets(server) == len(manifest.bundles)
    return manifest, server, a


# --------------------------------------------------------------------------- the good path


def test_an_agent_fetches_every_bundle_from_a_peer_that_holds_it(seeded: Any, agent_factory: Any) -> None:
    manifest, server, a = seeded
    b = agent_factory("b", tcp=True, env=_peer_env(a.url))
    record = _cache(b, server)
    _verified(b, manifest, record)
    assert _bundle_gets(server) == len(manifest.bundles), "the store served nothing more"
    assert _metric(a, "served") > 0 and _metric(a, "served") == _metric(b, "fetched")


def test_bundle_requests_spread_over_the_peers_that_hold_the_version(seeded: Any, agent_factory: Any) -> None:
    manifest, server, a = seeded
    b = agent_factory("b", tcp=True, env=_peer_env(a.url))
    _cache(b, server)
    c = agent_factory("c", tcp=True, env=_peer_env(a.url, b.url))
    _verified(c, manifest, _cache(c, server))
    assert _bundle_gets(server) == len(manifest.bundles)
    assert _metric(a, "served") > _metric(b, "fetched") / 2 > 0  # a served b wholly, and some of c
    assert _metric(b, "served") > 0, "b served part of c's bundles"


# --------------------------------------------------------------------------- what peers refuse


def test_peer_requests_without_the_peer_token_are_401(seeded: Any) -> None:
    manifest, _, a = seeded
    url = f"{a.url}/v1/peer/bundles/{manifest.bundles[0].digest}"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    transport = httpx.HTTPTransport(uds=str(a.socket))
    with httpx.Client(transport=transport) as over_socket:  # the unix socket is no way round it
        assert over_socket.get(f"http://agent/v1/peer/bundles/{manifest.bundles[0].digest}").status_code == 401


def test_an_agent_without_a_peer_token_serves_no_peer(store: Any, agent_factory: Any) -> None:
    manifest, server = store
    a = agent_factory("a", tcp=True)
    _cache(a, server)
    response = httpx.get(
        f"{a.url}/v1/peer/bundles/{manifest.bundles[0].digest}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == 401


def test_a_version_being_fetched_serves_what_it_finished_and_425_for_what_it_downloads(
    store: Any, agent_factory: Any, tmp_path: Path
) -> None:
    """Mid-fetch, a bundle already unpacked (verified, synced, in place in staging) is served
    and unpacks verified; the one being downloaded answers 425; one not started, 404."""
    manifest, server = store
    slow = manifest.bundles[2].digest
    server.slow_down(lambda p: slow in p, 4.0)
    nobody = "http://127.0.0.1:9"  # peers on (so the agent marks what it downloads), but none answers
    a = agent_factory("a", tcp=True, env=_peer_env(nobody, DSAGENT_FETCH_WORKERS="1", DSAGENT_NODE_NAME="a"))
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Dsagent-Peer": "b"}
    with a.client() as client:
        client.submit_task("t1", [{"name": "imgs", "source": f"{server.url}/src", "bundles": f"{server.url}/store"}])
        deadline = time.monotonic() + 20
        while not server.gets(lambda p: slow in p) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.get_task("t1")["state"] == "pending"
        requested = {b.digest for b in manifest.bundles if server.gets(lambda p, d=b.digest: d in p)}
        finished = [b for b in manifest.bundles if b.digest in requested - {slow}]
        assert finished, "one fetch worker: the bundles asked for before the slow one are unpacked"
        for bundle in manifest.bundles:
            response = httpx.get(f"{a.url}/v1/peer/bundles/{bundle.digest}", headers=headers)
            expected = 200 if bundle in finished else 425 if bundle.digest == slow else 404
            assert response.status_code == expected, bundle
            if expected == 200:
                (tmp_path / bundle.digest).mkdir()
                unpack_bundle_stream(io.BytesIO(response.content), manifest, bundle, tmp_path / bundle.digest)
        assert wait_ready(client, "t1")["state"] == "ready"
    assert httpx.get(f"{a.url}/v1/peer/bundles/{slow}", headers=headers).status_code == 200


def test_agents_starting_together_read_each_bundle_from_the_store_about_once(store: Any, agent_factory: Any) -> None:
    """Three agents asked for the same new version at once (each store bundle takes 0.5 s):
    they ask each other first, wait for the one downloading a bundle, and end verified with
    the store read about once (3x without peers)."""
    manifest, server = store
    server.slow_down(lambda p: "/store/bundles/" in p, 0.5)
    with held_ports(3) as held:  # kept from other tests until the agents listen
        ports = dict(zip("abc", held))
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        agents = {
            name: agent_factory(
                name,
                tcp=True,
                port=ports[name],
                env=_peer_env(*(u for other, u in urls.items() if other != name), DSAGENT_NODE_NAME=name),
            )
            for name in "abc"
        }
    request = [{"name": "imgs", "source": f"{server.url}/src", "bundles": f"{server.url}/store"}]
    for agent in agents.values():
        with agent.client() as client:
            client.submit_task("t1", request)
    for agent in agents.values():
        with agent.client() as client:
            record = wait_ready(client, "t1")
        assert record["state"] == "ready", record
        _verified(agent, manifest, record)
    assert _bundle_gets(server) <= len(manifest.bundles) + 2, server.gets(lambda p: "/store/bundles/" in p)
    assert sum(_metric(agent, "fetched") for agent in agents.values()) > 0


def test_upload_limits_refuse_with_429_per_peer_and_503_in_all() -> None:
    limits = UploadLimits(total=3, per_peer=2, rate=0)
    limits.acquire("b")
    limits.acquire("b")
    with pytest.raises(PeerBusy) as busy:
        limits.acquire("b")
    assert busy.value.http_status == 429
    limits.acquire("c")
    with pytest.raises(PeerOverloaded) as overloaded:
        limits.acquire("d")
    assert overloaded.value.http_status == 503
    limits.release("b")
    limits.acquire("d")
    assert limits.running == 3


def test_a_refusing_peer_is_skipped_and_the_store_serves(seeded: Any, agent_factory: Any) -> None:
    manifest, server, a = seeded
    b = agent_factory("b", tcp=True, env=_peer_env(a.url, DSAGENT_PEER_TOKEN="another-token-0123456789"))
    _verified(b, manifest, _cache(b, server))
    assert _bundle_gets(server) == 2 * len(manifest.bundles)


# --------------------------------------------------------------------------- peers that misbehave


STALL_S = 120.0


class _BadPeer(http.server.ThreadingHTTPServer):
    """Claims to hold ``name@digest`` and answers bundle requests the way ``mode`` says:
    ``lie`` (a valid stream of wrong bytes), ``die`` (half the real bundle, then the
    connection drops) or ``stall`` (headers, then silence)."""

    daemon_threads = True

    def __init__(self, manifest: Manifest, store_dir: Path, mode: str) -> None:
        self.manifest, self.store_dir, self.mode = manifest, store_dir, mode
        self.bundle_requests = 0
        self.inventory_bytes_sent = 0
        self.released = threading.Event()  # ends a stall (set when the test is done)
        super().__init__(("127.0.0.1", 0), _BadPeerHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _BadPeerHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _BadPeer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        m = self.server.manifest
        if self.path == "/v1/inventory" and self.server.mode in INVENTORY_MODES:
            self._bad_inventory(self.server.mode)
            return
        if self.path == "/v1/inventory":
            body = json.dumps({"version": 1, "datasets": {m.name: {"digest": m.digest, "state": "ready"}}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.server.bundle_requests += 1
        digest = self.path.rsplit("/", 1)[-1]
        real = Path(bundle_path(str(self.server.store_dir), digest)).read_bytes()
        if self.server.mode == "lie":  # a whole, valid bundle of the same members with other bytes
            other = next(b for b in m.bundles if b.digest != digest)
            real = Path(bundle_path(str(self.server.store_dir), other.digest)).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(real)))
        self.end_headers()
        if self.server.mode == "stall":  # silent far longer than any fetch that honours its timeout
            self.server.released.wait(STALL_S)
            return
        if self.server.mode == "die":
            self.wfile.write(real[: len(real) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(real)

    def _bad_inventory(self, mode: str) -> None:
        """``deep``: nested past the parser's stack; ``listy``: ``datasets`` a list of lists;
        ``huge``: 64 MB that claims the version ready, written 1 MB at a time, counted."""
        m = self.server.manifest
        if mode == "deep":
            chunks = [b'{"version": 1, "datasets": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"]
        elif mode == "listy":
            chunks = [json.dumps({"version": 1, "datasets": [[m.name, m.digest, "ready"]]}).encode()]
        else:
            head = json.dumps({"version": 1, "datasets": {m.name: {"digest": m.digest, "state": "ready"}}, "pad": ""})
            pad = 64 << 20
            chunks = [head[:-2].encode()] + [b"x" * (1 << 20)] * (pad >> 20) + [b'"}']
        self.send_response(200)
        self.send_header("Content-Length", str(sum(map(len, chunks))))
        self.end_headers()
        try:
            for chunk in chunks:
                self.wfile.write(chunk)
                self.server.inventory_bytes_sent += len(chunk)
        except OSError:
            self.close_connection = True


INVENTORY_MODES = ("deep", "listy", "huge")


@pytest.mark.parametrize("mode", INVENTORY_MODES)
def test_a_peer_with_a_hostile_inventory_is_only_unusable(
    mode: str, store: Any, agent_factory: Any, tmp_path: Path
) -> None:
    """A deeply nested, oddly shaped or huge inventory leaves the fetch to the other sources
    (the peer's bundles, if it serves them, or the store), verified; the agent stops reading a
    huge one at its limit (docs/threat-model.md)."""
    manifest, server = store
    bad = _BadPeer(manifest, tmp_path / "www" / "store", mode)
    try:
        b = agent_factory("b", tcp=True, env=_peer_env(bad.url, DSAGENT_PEER_TIMEOUT="5s"))
        _verified(b, manifest, _cache(b, server))
        if mode == "huge":
            assert bad.inventory_bytes_sent < 32 << 20, "the agent read the whole 64 MB inventory"
    finally:
        bad.shutdown()
        bad.server_close()


@pytest.mark.parametrize("mode", ["lie", "die", "stall"])
def test_a_misbehaving_peer_falls_back_to_the_store_verified(
    mode: str, store: Any, agent_factory: Any, tmp_path: Path
) -> None:
    manifest, server = store
    bad = _BadPeer(manifest, tmp_path / "www" / "store", mode)
    try:
        b = agent_factory("b", tcp=True, env=_peer_env(bad.url, DSAGENT_PEER_TIMEOUT="1s"))
        started = time.monotonic()
        _verified(b, manifest, _cache(b, server))
        assert bad.bundle_requests >= 1, "the peer was asked"
        assert _bundle_gets(server) == len(manifest.bundles), "every bundle came from the store in the end"
        assert _metric(b, "fetched") == 0
        if mode == "stall":  # a hang detector, not a timing target: waiting out the stall takes STALL_S
            assert time.monotonic() - started < STALL_S / 2, "the stalled peer was given up on its timeout"
    finally:
        bad.released.set()
        bad.shutdown()
        bad.server_close()


# --------------------------------------------------------------------------- pieces


def test_of_two_agents_asking_each_other_at_once_exactly_one_goes_to_the_store() -> None:
    """The rule the peer server answers 425 by: a bundle being downloaded here is waited for by
    anyone; one this agent is still asking its peers for, only by the agent that comes after
    it for that bundle (``precedes``), and the one before it makes this agent yield."""
    from dsagent.cache.metrics import Metrics
    from dsagent.cache.peers import PeerFetcher, precedes
    from dsagent.cache.settings import Settings

    def fetcher(name: str) -> PeerFetcher:
        settings = Settings.from_env({"DSAGENT_NODE_NAME": name, "DSAGENT_PEER_TOKEN": TOKEN})
        return PeerFetcher(settings, None, Metrics())  # type: ignore[arg-type]

    agents = {name: fetcher(name) for name in ("node-a", "node-b")}
    try:
        for digest in (f"{i:032x}" for i in range(8)):
            first, second = ("node-a", "node-b") if precedes("node-a", "node-b", digest) else ("node-b", "node-a")
            assert precedes(first, second, digest) and not precedes(second, first, digest)
            for second_asks_first in (True, False):  # whichever asks first, the same one downloads
                with agents[first].claim(digest, "asking") as a, agents[second].claim(digest, "asking") as b:
                    if second_asks_first:
                        assert agents[first].in_flight(digest, second), "the second waits for the first"
                        assert not agents[second].in_flight(digest, first), "the first goes on"
                    else:
                        assert not agents[second].in_flight(digest, first)
                        assert agents[first].in_flight(digest, second)
                    assert (a.downloading(), b.downloading()) == (True, False)  # the second yielded
        winners = {"node-a" if precedes("node-a", "node-b", f"{i:032x}") else "node-b" for i in range(64)}
        assert winners == set(agents), "which agent reads the store differs from bundle to bundle"
        b = agents["node-b"]
        with b.claim("d" * 32, "asking") as claim:
            assert claim.downloading()
            assert b.in_flight("d" * 32, "node-a"), "a download in progress is waited for by anyone"
            claim.finished()
        assert b.in_flight("d" * 32, "node-c"), "finished but not recorded done yet: still 425"
        b.release("d" * 32)
        assert not b.in_flight("d" * 32, "node-c"), "nothing claimed: 404"
    finally:
        for agent in agents.values():
            agent.close()


# --------------------------------------------------------------------------- the cluster's own P2P engine


def test_bundle_downloads_go_through_the_stores_proxy_and_manifests_do_not(store: Any, agent_factory: Any) -> None:
    from tests.dsagent.caching_proxy import CachingProxy

    manifest, server = store
    proxy = CachingProxy()
    try:
        env = {"DSAGENT_STORE_PROXIES": f"{server.url}/store={proxy.url}"}
        for name in ("a", "b"):
            agent = agent_factory(name, env=env)
            _verified(agent, manifest, _cache(agent, server))
        bundles = {url for url in proxy.served if "/store/bundles/" in url}
        assert len(bundles) == len(manifest.bundles)
        assert all(proxy.served[url] >= 2 for url in bundles), "both agents read every bundle through the proxy"
        assert _bundle_gets(server) == len(manifest.bundles), "the origin served each bundle once"
        assert not [url for url in proxy.served if "manifest" in url], (
            "manifests change under one name: never through the proxy"
        )
    finally:
        proxy.close()


def test_bundle_options_add_the_proxy_of_the_matching_store_only() -> None:
    from dsagent.cache.peers import bundle_options
    from dsagent.cache.settings import Settings
    from dsagent.format.storageconfig import StorageConfig, store_options, user_options, with_config

    settings = Settings.from_env(
        {"DSAGENT_STORE_PROXIES": "http://store:80/ds=http://127.0.0.1:65001, s3://bucket=http://127.0.0.1:65001"}
    )
    assert user_options(bundle_options(settings, "http://store:80/ds", None)) == {"proxy": "http://127.0.0.1:65001"}
    assert user_options(bundle_options(settings, "http://store:80/ds/sub", {"a": 1})) == {
        "a": 1,
        "proxy": "http://127.0.0.1:65001",
    }
    assert bundle_options(settings, "http://store:80/dsx", None) is None
    bounds = StorageConfig(2.0, 3.0)  # the storage bounds stay beside the options the proxy is added to
    assert store_options(bundle_options(settings, "http://store:80/ds", with_config({}, bounds))).config == bounds
    s3 = user_options(bundle_options(settings, "s3://bucket/packs", {"anon": True}))
    assert s3 == {
        "anon": True,
        "config_kwargs": {"proxies": {"http": "http://127.0.0.1:65001", "https": "http://127.0.0.1:65001"}},
    }


def test_cluster_mode_finds_holders_in_the_node_inventories() -> None:
    """Agents holding the version ready come first, then those fetching it (they serve what
    they finished), then its stripe group's members with bundles held; itself, nodes without
    an inventory and failed versions are left out."""
    from types import SimpleNamespace as NS

    from dsagent.cache.inventory import ANNOTATION
    from dsagent.nodeagent import peerlist

    def holders_from_nodes(*args: Any, **kw: Any) -> list[str]:
        return [h.url for h in peerlist.holders_from_nodes(*args, **kw)]

    def node(name: str, inventory: Any, ip: str = "10.0.0.1") -> Any:
        annotations = {ANNOTATION: json.dumps(inventory)} if inventory is not None else {}
        return NS(
            metadata=NS(name=name, annotations=annotations),
            status=NS(addresses=[NS(type="Hostname", address=name), NS(type="InternalIP", address=ip)]),
        )

    held = {"datasets": {"imgs": {"digest": "a" * 32, "state": "ready"}}}
    nodes = [
        node("me", held, "10.0.0.9"),
        node("n1", held, "10.0.0.1"),
        node("n2", {"datasets": {"imgs": {"digest": "a" * 32, "state": "fetching"}}}, "10.0.0.2"),
        node("n3", None, "10.0.0.3"),
        node("n4", held, "fd00::4"),
        node("n5", {"datasets": {"imgs": {"digest": "a" * 32, "state": "failed"}}}, "10.0.0.5"),
    ]
    assert holders_from_nodes(nodes, "me", "imgs", "a" * 32, 7420) == [
        "http://10.0.0.1:7420",
        "http://[fd00::4]:7420",
        "http://10.0.0.2:7420",
    ]
    # members of the version's stripe group that hold bundles come last (each serves its
    # own); a share of another version, or one with nothing held yet, is no source
    share = {"datasets": {}, "stripes": {"imgs": {"digest": "a" * 32, "sizeBytes": 9, "heldBytes": 3, "members": 2}}}
    empty = {"datasets": {}, "stripes": {"imgs": {"digest": "a" * 32, "sizeBytes": 9, "heldBytes": 0, "members": 2}}}
    other = {"datasets": {}, "stripes": {"imgs": {"digest": "b" * 32, "sizeBytes": 9, "heldBytes": 3, "members": 2}}}
    striped = [node("s1", share, "10.0.1.1"), node("s2", empty, "10.0.1.2"), node("s3", other, "10.0.1.3")]
    assert holders_from_nodes([*striped, *nodes], "me", "imgs", "a" * 32, 7420) == [
        "http://10.0.0.1:7420",
        "http://[fd00::4]:7420",
        "http://10.0.0.2:7420",
        "http://10.0.1.1:7420",
    ]
    # a member of the group asks beyond it only for whole copies
    assert holders_from_nodes([*striped, *nodes], "me", "imgs", "a" * 32, 7420, shares=False) == [
        "http://10.0.0.1:7420",
        "http://[fd00::4]:7420",
        "http://10.0.0.2:7420",
    ]
    # another node's annotation is another party's JSON: nested past the stack, or shaped
    # otherwise, that node is left out and the rest still count
    deep = node("n6", None, "10.0.0.6")
    deep.metadata.annotations = {ANNOTATION: "[" * 100_000 + "]" * 100_000}
    listy = node("n7", {"datasets": [["imgs", "a" * 32, "ready"]]}, "10.0.0.7")
    versions = node("n8", {"datasets": {"imgs": {"versions": {"digest": "a" * 32}}}}, "10.0.0.8")
    assert (
        holders_from_nodes([deep, listy, versions, *nodes], "me", "imgs", "a" * 32, 7420)[0] == "http://10.0.0.1:7420"
    )
    # each holder names its node; a share also its version's group, when its inventory lists it
    grouped = {"datasets": {}, "stripes": {"imgs": {**share["stripes"]["imgs"], "group": ["s1", "s9"]}}}  # type: ignore[index]
    records = peerlist.holders_from_nodes([node("s1", grouped, "10.0.1.1"), *nodes[:2]], "me", "imgs", "a" * 32, 7420)
    assert [(h.state, h.node, h.group) for h in records] == [("ready", "n1", ()), ("share", "s1", ("s1", "s9"))]
    lying = {"datasets": {}, "stripes": {"imgs": {**share["stripes"]["imgs"], "group": ["s1", 7]}}}  # type: ignore[index]
    [record] = peerlist.holders_from_nodes([node("s1", lying, "10.0.1.1")], "me", "imgs", "a" * 32, 7420)
    assert record.group == ()  # a malformed group is no group: the members are asked in turn


def test_the_per_peer_upload_limit_keys_on_the_address_not_the_self_named_header() -> None:
    """Keyed on X-Dsagent-Peer, one peer naming itself anew on each request
    got a fresh per-peer allowance each time; the address it connected from is what it proved."""
    from starlette.requests import Request

    from dsagent.api.routes import peer_identity

    def request(name: str, host: str) -> Request:
        headers = [(b"x-dsagent-peer", name.encode())]
        return Request({"type": "http", "headers": headers, "client": (host, 40000)})

    limits = UploadLimits(total=10, per_peer=1, rate=0)
    limits.acquire(peer_identity(request("b", "10.0.0.7")))
    with pytest.raises(PeerBusy):  # another name, the same address: the same peer
        limits.acquire(peer_identity(request("c", "10.0.0.7")))
    limits.acquire(peer_identity(request("b", "10.0.0.8")))  # the same name elsewhere: another peer


def test_a_session_asks_a_striped_bundles_owner_first_and_the_rest_in_turn() -> None:
    from dsagent.cache.peers.peersession import PeerSession
    from dsagent.cache.servicehooks import PeerHolder
    from dsplatform.stripe import owner

    group = ("node-a", "node-b", "node-c")
    found = [
        PeerHolder("http://ready:1", "ready", "node-r"),
        *(PeerHolder(f"http://{n}:1", "share", n, group) for n in group),
    ]
    session = PeerSession.of(found)
    keys = [f"{i:032x}" for i in range(60)]
    assert {owner(k, group) for k in keys} == set(group)  # every member owns some
    for i, key in enumerate(keys):
        order = session.order(i, key)
        assert order[0] == f"http://{owner(key, group)}:1"
        assert sorted(order) == sorted(h.url for h in found)  # everyone still asked after it
    assert session.order(1) == [h.url for h in found[1:]] + [found[0].url]  # no key: in turn
    with session.slot(0, keys[0]) as peers:
        assert peers[0] == f"http://{owner(keys[0], group)}:1"
    # an owner that failed is not asked; a group whose owner is not found: in turn
    session.drop(f"http://{owner(keys[0], group)}:1")
    assert f"http://{owner(keys[0], group)}:1" not in session.order(0, keys[0])
    unknown = PeerSession.of([PeerHolder("http://node-a:1", "share", "node-a", ("node-a", "node-z"))])
    lost = next(k for k in keys if owner(k, ("node-a", "node-z")) == "node-z")
    assert unknown.order(0, lost) == ["http://node-a:1"]
    # a session that learns the group only on a refresh asks the owner from then on
    later = PeerSession.of([PeerHolder("http://ready:1", "ready", "node-r")], refresh=lambda: found)
    later.maybe_refresh(force=True)
    assert later.order(0, keys[5])[0] == f"http://{owner(keys[5], group)}:1"
