"""A version fetched over several links, each connection bound to one local address
(docs/design.md#links).

Loopback addresses stand for the node's NICs: 127.0.0.2, 127.0.0.3 and 127.0.0.4 all route
to ``lo`` on Linux, and a server sees which one a connection came from. The store is a real
HTTP server here that records the source address of every bundle request (and can cut the
responses to one address mid-body: a link that fails mid-transfer); peers are real agents,
and a TCP relay stands between two of them where a link must fail.
"""

from __future__ import annotations

import http.server
import logging
import os
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.fetchlinks import LinkSet, addresses_of, bound_options, choose_links
from dsagent.cache.settings import Settings
from dsagent.errors import SourceUnavailable
from dsagent.format.bundles.bundle import pack, verify_tree
from dsagent.format.manifest import Manifest
from dsagent.format.storageconfig import StorageConfig, store_options, user_options, with_config
from gpu_topology import Gpu, Link, Nic, Topology, transfer_nics
from tests.dsagent.conftest import write_tree
from tools.support.harness import AgentProcess, wait_ready

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="127.0.0.0/8 routes to lo on Linux only")

TOKEN = "peer-token-0123456789abcdef"
LINKS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: incompressible, so that every bundle is tens of KiB on the wire and a cut lands mid-body
FILES = {f"shard{i % 4}/part{i:03d}.bin": os.urandom(20_000 + 331 * i) for i in range(36)}


# --------------------------------------------------------------------------- the store


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RecordingStore

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_GET(self) -> None:
        if "/bundles/" not in self.path:
            super().do_GET()
            return
        source = self.client_address[0]
        path = Path(self.translate_path(self.path))
        with self.server.lock:
            self.server.seen[source] += 1
        if not path.is_file():
            super().do_GET()
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if source in self.server.cut:  # the link fails mid-transfer
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)
        with self.server.lock:
            self.server.delivered[source] += 1


class RecordingStore(http.server.ThreadingHTTPServer):
    """A bundle store over HTTP on ``host`` that records who asked for each bundle."""

    daemon_threads = True

    def __init__(self, directory: Path, host: str = "127.0.0.1") -> None:
        self.seen: Counter[str] = Counter()  # bundle requests by source address
        self.delivered: Counter[str] = Counter()  # bundles sent whole, by source address
        self.cut: set[str] = set()
        self.lock = threading.Lock()
        super().__init__((host, 0), lambda *a: _Handler(*a, directory=str(directory)))
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # cut connections

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Manifest, RecordingStore]]:
    www = tmp_path / "www"
    write_tree(www / "src", FILES)
    manifest = pack(www / "src", www / "store", name="shards", max_files=3)
    assert len(manifest.bundles) >= 12
    server = RecordingStore(www)
    yield manifest, server
    server.shutdown()
    server.server_close()


def _cache(agent: AgentProcess, store: tuple[Manifest, RecordingStore], task: str = "t1") -> dict[str, Any]:
    manifest, server = store
    with agent.client() as client:
        client.submit_task(task, [{"name": "shards", "source": f"{server.url}/src", "bundles": f"{server.url}/store"}])
        record = wait_ready(client, task)
    assert record["state"] == "ready", record
    verify_tree(Path(record["datasets"][0]["path"]), manifest)  # every bundle verified, all in place
    return record


def _metrics(agent: AgentProcess, name: str) -> dict[str, float]:
    """``name``'s samples by their ``link`` label."""
    with agent.client() as client:
        text = client.metrics()
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf'{name}\{{(?:[^}}]*,)?link="([^"]+)"[^}}]*\}} (\S+)', line)
        if match:
            found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
    return found


def _links_env(**extra: str) -> dict[str, str]:
    return {"DSAGENT_FETCH_LINKS": ",".join(LINKS), "DSAGENT_FETCH_WORKERS": "3", **extra}


def test_a_store_fetch_spreads_its_bundles_over_every_link(store: Any, agent_factory: Any) -> None:
    manifest, server = store
    agent = agent_factory("b", env=_links_env())
    _cache(agent, store)
    assert set(server.seen) == set(LINKS), f"the store saw connections from {dict(server.seen)}"
    assert sum(server.seen.values()) == len(manifest.bundles), "each bundle read once"
    assert all(n >= 2 for n in server.seen.values()), f"bundles split over the links: {dict(server.seen)}"
    carried = _metrics(agent, "dsplatform_agent_link_bytes_total")
    assert set(carried) == set(LINKS) and sum(carried.values()) == manifest.total_bytes


def test_a_link_that_fails_mid_transfer_hands_its_bundles_to_the_others(store: Any, agent_factory: Any) -> None:
    manifest, server = store
    server.cut.add("127.0.0.3")
    agent = agent_factory("b", env=_links_env())
    _cache(agent, store)  # ready and verified
    assert server.seen["127.0.0.3"] >= 1 and server.delivered["127.0.0.3"] == 0
    assert server.delivered["127.0.0.2"] + server.delivered["127.0.0.4"] == len(manifest.bundles)
    assert server.seen["127.0.0.3"] <= 3, "set aside after its first failures (one per worker at most)"
    assert _metrics(agent, "dsplatform_agent_link_failures_total") == {"127.0.0.3": 1.0}
    carried = _metrics(agent, "dsplatform_agent_link_bytes_total")
    assert carried.get("127.0.0.3", 0) == 0 and sum(carried.values()) == manifest.total_bytes
    assert "link 127.0.0.3 failed" in agent.log.read_text()


def test_without_fetch_links_the_default_route_carries_everything(store: Any, agent_factory: Any) -> None:
    _, server = store
    _cache(agent_factory("b"), store)
    assert set(server.seen) == {"127.0.0.1"}


# --------------------------------------------------------------------------- peers


def _peer_env(*peers: str, **extra: str) -> dict[str, str]:
    return {"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_PEERS": ",".join(peers), **extra}


def _sent_to(agent: AgentProcess) -> Counter[str]:
    return Counter(re.findall(r"sent bundle \w+ to (\S+) ", agent.log.read_text()))


@pytest.fixture
def seeded(store: Any, agent_factory: Any) -> AgentProcess:
    """Agent ``a`` holds ``shards`` ready, fetched from the store."""
    _, server = store
    a = agent_factory("a", tcp=True, env=_peer_env())
    _cache(a, store)
    server.seen.clear()
    return a


def test_a_peer_fetch_spreads_its_bundles_over_every_link(store: Any, seeded: AgentProcess, agent_factory: Any) -> None:
    manifest, server = store
    b = agent_factory("b", tcp=True, env={**_peer_env(seeded.url), **_links_env()})
    _cache(b, store)
    assert not server.seen, "every bundle came from the peer"
    sent = _sent_to(seeded)
    assert set(sent) == set(LINKS), f"the peer saw connections from {dict(sent)}"
    assert sum(sent.values()) == len(manifest.bundles) and all(n >= 2 for n in sent.values())
    carried = _metrics(b, "dsplatform_agent_link_bytes_total")
    assert sum(carried.values()) == manifest.total_bytes


class CuttingRelay:
    """A TCP relay to ``upstream`` that forwards a connection's bytes unchanged, except that
    it cuts connections from the addresses in ``cut`` after ``after`` bytes of response."""

    def __init__(self, upstream: tuple[str, int], cut: set[str], after: int) -> None:
        self.upstream, self.cut, self.after = upstream, cut, after
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.cuts: Counter[str] = Counter()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, (source, _) = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream, source_address=(source, 0))
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            limit = self.after if source in self.cut else None
            threading.Thread(target=self._pump, args=(upstream, client, (source, limit)), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, cut: tuple[str, int | None] | None) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if cut is not None and cut[1] is not None and sent + len(data) > cut[1]:
                    dst.sendall(data[: cut[1] - sent])
                    self.cuts[cut[0]] += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closing = True
        self.sock.close()


def test_a_link_that_fails_mid_transfer_from_a_peer_hands_its_bundles_to_the_others(
    store: Any, seeded: AgentProcess, agent_factory: Any
) -> None:
    manifest, server = store
    assert seeded.port is not None
    relay = CuttingRelay(("127.0.0.1", seeded.port), {"127.0.0.3"}, after=16_384)
    try:
        b = agent_factory("b", tcp=True, env={**_peer_env(relay.url), **_links_env()})
        _cache(b, store)  # ready and verified
    finally:
        relay.close()
    assert relay.cuts["127.0.0.3"] >= 1
    assert not server.seen, "the peer was kept: the link was at fault, and the other links delivered"
    assert _metrics(b, "dsplatform_agent_link_failures_total") == {"127.0.0.3": 1.0}
    carried = _metrics(b, "dsplatform_agent_link_bytes_total")
    assert carried.get("127.0.0.3", 0) == 0 and sum(carried.values()) == manifest.total_bytes
    assert set(_sent_to(seeded)) >= {"127.0.0.2", "127.0.0.4"}


# --------------------------------------------------------------------------- the parts


def test_leases_go_to_the_least_busy_link_nearest_first() -> None:
    """Ties go to the link listed first: ``auto`` lists the NICs nearest the GPUs first."""
    links = LinkSet(LINKS)
    with links.lease() as a, links.lease() as b, links.lease() as c, links.lease() as d:
        assert [a.address, b.address, c.address, d.address] == [*LINKS, LINKS[0]]
    for _ in range(3):
        with links.lease() as e:
            assert e.address == LINKS[0], "one transfer at a time: the nearest link carries it"
    with links.lease() as f, links.lease() as g:
        assert [f.address, g.address] == list(LINKS[:2])


def test_a_link_is_set_aside_only_when_another_delivers_what_it_failed() -> None:
    links = LinkSet(LINKS)
    calls: list[str | None] = []

    def failing_on(bad: set[str | None]) -> Any:
        def call(address: str | None) -> str | None:
            calls.append(address)
            if address in bad:
                raise SourceUnavailable(f"reset over {address}")
            return address

        return call

    with links.lease() as lease:
        assert lease.address == "127.0.0.2"
        assert lease.attempt(failing_on({"127.0.0.2"}), source="store", size=10) == "127.0.0.3"
    assert set(links.set_aside) == {"127.0.0.2"} and links.bytes["127.0.0.3"] == 10
    with links.lease() as lease, pytest.raises(SourceUnavailable):  # the source fails over two links
        lease.attempt(failing_on(set(LINKS)), source="store", size=10)
    assert set(links.set_aside) == {"127.0.0.2"}, "a source's failure sets no link aside"
    with links.lease() as lease:
        assert lease.address != "127.0.0.2", "a link set aside carries no more bundles"


def test_the_last_link_is_never_set_aside() -> None:
    links = LinkSet(LINKS[:2])

    def call(address: str | None) -> str | None:
        if address == "127.0.0.2":
            raise OSError("link down")
        return address

    with links.lease() as lease:
        lease.attempt(call, source="peer", size=1)
    with links.lease() as lease:
        assert lease.address == "127.0.0.3"
        lease.attempt(call, source="peer", size=1)
    assert set(links.set_aside) == {"127.0.0.2"}


def test_fetch_links_settings() -> None:
    assert Settings.from_env({"DSAGENT_FETCH_LINKS": "10.0.0.5, 10.0.1.5"}).fetch_links == ("10.0.0.5", "10.0.1.5")
    assert Settings.from_env({"DSAGENT_FETCH_LINKS": "auto"}).fetch_links == ("auto",)
    assert Settings.from_env({}).fetch_links == ()
    for bad in ("eth0", "auto,10.0.0.5"):
        with pytest.raises(Exception, match="DSAGENT_FETCH_LINKS"):
            Settings.from_env({"DSAGENT_FETCH_LINKS": bad})
    one = Settings.from_env({"DSAGENT_FETCH_LINKS": "10.0.0.5"})
    assert choose_links(one).addresses == (), "one link is the default route"


def test_auto_takes_the_addresses_of_the_nics_near_the_gpus() -> None:
    topology = Topology(
        gpus=(Gpu(0), Gpu(1)),
        nics=(
            Nic("mlx5_0", link_layer="Ethernet", addresses=("fe80::1/64", "10.0.0.5/24")),
            Nic("mlx5_1", link_layer="Ethernet", addresses=("10.0.1.5/24",)),
            Nic("mlx5_2", link_layer="Ethernet", addresses=("10.0.2.5/24",)),
        ),
        links={
            "GPU0": {"mlx5_0": Link.parse("PIX"), "mlx5_1": Link.parse("SYS"), "mlx5_2": Link.parse("SYS")},
            "GPU1": {"mlx5_0": Link.parse("SYS"), "mlx5_1": Link.parse("PXB"), "mlx5_2": Link.parse("SYS")},
        },
    )
    assert addresses_of(transfer_nics(topology)) == ("10.0.0.5", "10.0.1.5")
    assert addresses_of(transfer_nics(Topology(nics=topology.nics))) == ("10.0.0.5", "10.0.1.5", "10.0.2.5")
    loopback = Topology(
        gpus=(Gpu(0),),
        nics=tuple(Nic(f"mlx5_{i}", link_layer="Ethernet", addresses=(f"{a}/8",)) for i, a in enumerate(LINKS)),
        links={"GPU0": {"mlx5_0": Link.parse("PIX"), "mlx5_1": Link.parse("NODE"), "mlx5_2": Link.parse("SYS")}},
    )
    assert choose_links(Settings(fetch_links=("auto",)), loopback).addresses == ("127.0.0.2", "127.0.0.3")
    nearest_last = Topology(
        gpus=(Gpu(0),),
        nics=loopback.nics,
        links={"GPU0": {"mlx5_0": Link.parse("NODE"), "mlx5_1": Link.parse("PHB"), "mlx5_2": Link.parse("PIX")}},
    )
    assert choose_links(Settings(fetch_links=("auto",)), nearest_last).addresses == (
        "127.0.0.4",
        "127.0.0.3",
        "127.0.0.2",
    )


def test_addresses_that_are_not_on_this_node_are_left_out() -> None:
    """192.0.2.0/24 is TEST-NET-1: no node holds it, no socket can leave from it."""
    assert choose_links(Settings(fetch_links=("127.0.0.2", "192.0.2.7", "127.0.0.3"))).addresses == LINKS[:2]
    assert choose_links(Settings(fetch_links=("127.0.0.2", "192.0.2.7"))).addresses == (), (
        "one link left: the default route"
    )


def test_store_reads_are_bound_to_the_links_address() -> None:
    http = user_options(bound_options("http://store/b", {"client_kwargs": {"trust_env": False}}, "10.0.0.5"))
    assert repr(http["get_client"]) == "CheckedClient(unchecked, '10.0.0.5')"
    assert http["client_kwargs"] == {"trust_env": False}
    s3 = user_options(bound_options("s3://bucket/b", {"config_kwargs": {"connect_timeout": 3}}, "10.0.0.5"))
    assert s3["config_kwargs"]["connect_timeout"] == 3
    assert repr(s3["config_kwargs"]["connector_args"]["socket_factory"]) == "Guard(unchecked, '10.0.0.5')"
    bounds = StorageConfig(2.0, 3.0)  # the storage bounds stay beside the options the address is added to
    assert store_options(bound_options("http://store/b", with_config({}, bounds), "10.0.0.5")).config == bounds
    assert bound_options("gs://bucket/b", {"token": "anon"}, "10.0.0.5") == {"token": "anon"}
    assert bound_options("http://store/b", None, None) is None


def test_an_s3_store_read_leaves_from_the_links_address(s3: Any) -> None:
    """aiobotocore's connector takes the socket factory: the S3 server (moto, logging each
    request with its client address) sees each link's address."""
    import fsspec

    from dsagent.format.storage import resolve

    s3.create_bucket("links")
    fsspec.filesystem("s3", **s3.options(skip_instance_cache=True)).pipe("links/object", b"x" * 1000)
    with ThreadPoolExecutor(1) as pool:  # the agent reads stores from its workers
        for address in ("127.0.0.2", "127.0.0.3"):
            bound, path = resolve("s3://links/object", bound_options("s3://links", s3.options(), address))
            assert pool.submit(bound.cat_file, path).result() == b"x" * 1000
    log = Path(s3._log.name)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gets = set(re.findall(r"^(127\.0\.0\.\d+) .*\"GET /links/object", log.read_text(), re.M))
        if gets >= {"127.0.0.2", "127.0.0.3"}:
            break
        time.sleep(0.1)
    assert gets == {"127.0.0.2", "127.0.0.3"}


def test_auto_on_a_pod_network_is_the_default_route_said_in_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    """The chart's default without the host's network: the NICs' addresses (TEST-NET-2 here)
    are in no network namespace of the agent: no link, no warning."""
    elsewhere = Topology(
        gpus=(Gpu(0),),
        nics=tuple(Nic(f"mlx5_{i}", link_layer="Ethernet", addresses=(f"198.51.100.{i + 1}/24",)) for i in range(2)),
        links={"GPU0": {"mlx5_0": Link.parse("PIX"), "mlx5_1": Link.parse("PXB")}},
    )
    with caplog.at_level(logging.INFO, logger="dsagent"):
        assert choose_links(Settings(fetch_links=("auto",)), elsewhere).addresses == ()
    said = [r for r in caplog.records if "198.51.100.2" in r.getMessage() and "default route" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("links", "status", "reason", "said"),
    [
        ("127.0.0.2,127.0.0.3", "True", "Links", "fetches split over 127.0.0.2, 127.0.0.3"),
        ("127.0.0.2,192.0.2.7", "False", "NotOnNode", "fewer than two of 127.0.0.2, 192.0.2.7 on this node"),
    ],
    ids=["on", "off"],
)
def test_in_cluster_mode_the_node_says_which_links_and_why(
    apiserver: Any, agent_factory: Any, tmp_path: Path, links: str, status: str, reason: str, said: str
) -> None:
    """The ``DsplatformFetchLinks`` condition and a Node Event, as the device plugin's
    decision is said (docs/design.md#defaults)."""
    from tools.support.fake_apiserver import make_node

    apiserver.create(make_node("n1"))
    env = {
        "DSAGENT_KUBERNETES": "1",
        "KUBECONFIG": str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
        "DSAGENT_NODE_NAME": "n1",
        "DSAGENT_FETCH_LINKS": links,
    }
    agent_factory("b", env=env)
    deadline = time.monotonic() + 20
    while True:  # the condition, then the Event
        node = apiserver.get("nodes", "n1") or {}
        found = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "DsplatformFetchLinks"]
        events = [e for e in apiserver.list("events") if e["regarding"]["name"] == "n1"]
        if (found and events) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    [condition] = found
    assert (condition["status"], condition["reason"]) == (status, reason) and said in condition["message"]
    [event] = events
    assert event["reason"] == ("FetchLinksOn" if status == "True" else "FetchLinksOff") and said in event["note"]


def test_the_choice_says_why_there_are_no_links() -> None:
    """What the Node's condition says (:func:`choose_links`' reason and message)."""
    one = Topology(
        gpus=(Gpu(0),),
        nics=(Nic("mlx5_0", link_layer="Ethernet", addresses=("127.0.0.2/8",)),),
        links={"GPU0": {"mlx5_0": Link.parse("PIX")}},
    )
    auto = Settings(fetch_links=("auto",))
    assert choose_links(auto, one) == (
        (),
        "FewerThanTwoNics",
        "one NIC near the GPUs (127.0.0.2): fetches take the default route",
    )
    none_here = Topology(gpus=(Gpu(0),), nics=(Nic("mlx5_0", link_layer="Ethernet", addresses=("198.51.100.1/24",)),))
    assert choose_links(auto, none_here).reason == "FewerThanTwoNics"
    assert "no NIC near the GPUs with an address here" in choose_links(auto, none_here).message
    assert choose_links(Settings(), one) == ((), "Off", "DSAGENT_FETCH_LINKS is empty: fetches take the default route")
    two = Topology(
        gpus=(Gpu(0),),
        nics=tuple(Nic(f"mlx5_{i}", link_layer="Ethernet", addresses=(f"{a}/8",)) for i, a in enumerate(LINKS[:2])),
        links={"GPU0": {"mlx5_0": Link.parse("PIX"), "mlx5_1": Link.parse("PXB")}},
    )
    assert choose_links(auto, two) == (LINKS[:2], "Links", "fetches split over 127.0.0.2 (PIX), 127.0.0.3 (PXB)")
