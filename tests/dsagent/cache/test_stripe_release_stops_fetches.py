"""Letting a share go stops the bundle fetches it had under way, at their next step
(:meth:`dsagent.cache.striped.stripes.StripeShares._stop_fill`, :class:`dsagent.errors.FetchStopped`).

Those fetches run on threads no cancel reaches. Before they were told to stop, a release
(or a new group, or the agent's stop) waited for each to end by itself: for a peer that
answers "later" that is ``peer_wait`` (30 s by default), for the store a whole bundle.

End to end: a real agent fills its share of a two-member group whose other member, a
loopback server speaking the peer protocol, answers 425 ("downloading it, ask again") to
every ask; the release answers at once and the store was never read. Then the two other
steps a stop ends: a store download between two files, a peer's body between two pieces.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from dsagent.cache.peers.peerfetch import _PeerBody
from dsagent.cache.settings import Settings
from dsagent.cache.striped.stripefetch import BundleSources
from dsagent.errors import FetchStopped
from dsagent.format.bundles.bundle import pack
from tests.dsagent.api.test_pod_rights import POD, unix_client
from tests.dsagent.cache.test_stripe_lease import NODE, _pod_agent, _store
from tests.dsagent.conftest import write_tree
from tools.support.harness import ADMIN_TOKEN, LoopbackServer, eventually

TOKEN = "p" * 40
OTHER = "node-b"


class _AlwaysLater(BaseHTTPRequestHandler):
    """A member whose peer server is downloading every bundle: 425, ask again shortly."""

    asks = 0

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        type(self).asks += 1
        body = b'{"error": {"code": "peer_fetching", "message": "downloading it now"}}'
        self.send_response(425)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on loopback while the block runs: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def busy_peer() -> Iterator[str]:
    _AlwaysLater.asks = 0
    with _serving(_AlwaysLater) as url:
        yield url


def _release_while_read(
    agent: Any, store: str, busy_peer: str, manifest: Any, source: str, asked: Callable[[], bool], what: str
) -> list[httpx.Response]:
    """This node holds no share (``noShare``) of ``imgs``, whose other member is ``busy_peer``;
    its pod reads the first bundle through the window, and the version is released once
    ``asked()`` says the window's fetch is where the test wants it. The pod's answers."""
    route = f"/v1/stripes/imgs/{manifest.digest}/bundles/{manifest.bundles[0].digest}"
    body = {"store": store, "members": [NODE, OTHER], "peers": {OTHER: busy_peer}, "noShare": [NODE]}
    answers: list[httpx.Response] = []

    def read() -> None:
        with unix_client(agent) as reader:
            answers.append(reader.get(route))

    with unix_client(agent) as pod, unix_client(agent, ADMIN_TOKEN) as operator:
        assert operator.put("/v1/stripes/imgs", json=body).status_code == 200
        mine = {"name": "imgs", "source": source, "bundles": store}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [mine]}).status_code == 200
        reading = threading.Thread(target=read)
        reading.start()
        eventually(asked, what=what)
        released = operator.delete("/v1/stripes/imgs")
        assert released.status_code == 200, released.text
        reading.join(30)
    return answers


def test_a_release_does_not_wait_out_a_busy_peer(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], busy_peer: str
) -> None:
    www, url, server = loopback
    manifest = _store(www)
    agent = agent_factory(env={"DSAGENT_NODE_NAME": NODE, "DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_PEER_WAIT": "120s"})
    body = {"store": f"{url}/store", "members": [NODE, OTHER], "peers": {OTHER: busy_peer}}
    with unix_client(agent, ADMIN_TOKEN) as operator:
        held = operator.put("/v1/stripes/imgs", json=body)
        assert held.status_code == 200, held.text
        assert held.json()["bundlesOwned"] > 0
        # the fill waits on the other member (the previous owner)
        eventually(lambda: _AlwaysLater.asks >= 2, what="the fill to ask the other member")
        started = time.monotonic()
        released = operator.delete("/v1/stripes/imgs")  # the client gives up after 30 s
        took = time.monotonic() - started
        assert released.status_code == 200, released.text
        assert released.json() == {"name": "imgs", "released": [manifest.digest]}
        assert took < 10, f"the release took {took:.1f} s: it waited for the busy peer"
        assert operator.get(f"/v1/stripes/imgs/{manifest.digest}").status_code == 404
    assert not (agent.root / "stripes" / "imgs" / manifest.digest).exists()
    assert server.gets(lambda p: "/bundles/" in p) == {}  # stopped before the store, not sent to it


def test_a_release_stops_a_window_fetch_and_leaves_nothing_behind(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path, busy_peer: str
) -> None:
    """This node holds no share (``noShare``): its pod reads a bundle through the window,
    asked of the owner, which answers "later". Released meanwhile, the window's fetch ends
    too, before the version's directory goes: it does not go on to the store after the peer
    wait and write the bundle into a directory nobody holds."""
    www, url, _ = loopback
    manifest = _store(www)
    agent = _pod_agent(agent_factory, tmp_path, DSAGENT_PEER_TOKEN=TOKEN, DSAGENT_PEER_WAIT="3s")
    version = agent.root / "stripes" / "imgs" / manifest.digest
    answers = _release_while_read(
        agent, f"{url}/store", busy_peer, manifest, "memory://stripe-release/none",
        lambda: _AlwaysLater.asks >= 1, "the window to ask the owner",  # its fetch waits on the owner
    )  # fmt: skip
    time.sleep(4)  # past the peer wait, when a fetch left running would read the store
    assert not version.exists(), sorted(p.relative_to(agent.root) for p in version.rglob("*"))
    assert [a.status_code for a in answers] == [503], [a.text[:200] for a in answers]  # ask again


def test_a_reader_that_goes_stops_its_window_fetch(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path, busy_peer: str
) -> None:
    """A pod reads a bundle through the window; its owner answers "later" and the peer wait is
    long. The pod gives up and closes its connection: the agent stops the fetch nobody waits
    for at its next step (it does not go on asking the owner for the rest of the wait, then
    read the store), and nothing of the bundle is left in the window."""
    www, url, _ = loopback
    manifest = _store(www)
    agent = _pod_agent(agent_factory, tmp_path, DSAGENT_PEER_TOKEN=TOKEN, DSAGENT_PEER_WAIT="120s")
    window = agent.root / "stripes" / "imgs" / manifest.digest / "window"
    bundle = manifest.bundles[0]
    route = f"/v1/stripes/imgs/{manifest.digest}/bundles/{bundle.digest}"
    body = {"store": f"{url}/store", "members": [NODE, OTHER], "peers": {OTHER: busy_peer}, "noShare": [NODE]}
    with unix_client(agent) as pod, unix_client(agent, ADMIN_TOKEN) as operator:
        assert operator.put("/v1/stripes/imgs", json=body).status_code == 200
        mine = {"name": "imgs", "source": "memory://stripe-reader-gone/none", "bundles": f"{url}/store"}
        assert pod.put(f"/v1/tasks/{POD}", json={"datasets": [mine]}).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            pod.get(route, timeout=2.0)  # gives up: the connection closes
        deadline = time.monotonic() + 10
        while True:  # the fetch ends at its next step: the owner is asked no more
            asks = _AlwaysLater.asks
            time.sleep(1.0)
            if _AlwaysLater.asks == asks:
                break
            assert time.monotonic() < deadline, "the window's fetch still asks the owner after its reader went"
        assert asks > 0
        assert not window.exists() or list(window.iterdir()) == [], sorted(window.rglob("*"))


class _SlowInventory(BaseHTTPRequestHandler):
    """A configured peer slow to list what it holds: the window's lookup of whole copies
    waits on it (then it holds nothing)."""

    asks = 0

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        type(self).asks += 1
        time.sleep(2.0)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_release_during_the_windows_lookup_starts_no_fetch(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer], tmp_path: Path, busy_peer: str
) -> None:
    """The share is let go while the window's fetch still asks the peers who holds the
    version whole: the fetch ends there, before its thread starts, and makes no directory
    under the version the release has removed."""
    www, url, _ = loopback
    manifest = _store(www)
    _SlowInventory.asks = 0
    with _serving(_SlowInventory) as slow:
        agent = _pod_agent(agent_factory, tmp_path, DSAGENT_PEER_TOKEN=TOKEN, DSAGENT_PEERS=slow)
        version = agent.root / "stripes" / "imgs" / manifest.digest
        answers = _release_while_read(
            agent, f"{url}/store", busy_peer, manifest, "memory://stripe-release-lookup/none",
            lambda: _SlowInventory.asks >= 1, "the window to look for whole copies",
        )  # fmt: skip
    assert [a.status_code for a in answers] == [503], [a.text[:200] for a in answers]  # ask again
    assert _AlwaysLater.asks == 0  # the owner was never asked
    assert not version.exists(), sorted(p.relative_to(agent.root) for p in version.rglob("*"))


class _SetAfter(threading.Event):
    """An event that reads as set from its ``n``-th look on: "stopped" between two steps."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.looks, self.n = 0, n

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.n or super().is_set()


def test_a_stopped_store_download_ends_between_two_files_and_leaves_nothing(tmp_path: Path) -> None:
    # 4 MB: the loop reports its progress (where the stop is looked at) a piece of the stream at a time
    write_tree(tmp_path / "src", {f"f{i:03d}.bin": bytes([i]) * 100_000 for i in range(40)})
    manifest = pack(tmp_path / "src", tmp_path / "store", name="imgs")
    (ref,) = manifest.bundles
    counts = {"peer_bundles": 0, "store_bundles": 0}
    sources = BundleSources(Settings(root=tmp_path / "cache", node_name=NODE), None, counts)  # type: ignore[arg-type]
    version = SimpleNamespace(manifest=manifest, store=str(tmp_path / "store"), storage_options={}, peers={})
    into = tmp_path / "share"
    into.mkdir()
    stop = _SetAfter(3)  # the look before the store, then two pieces of the bundle
    with pytest.raises(FetchStopped, match="stopped"):
        sources.fetch(version, ref, into, [NODE], stop=stop)  # type: ignore[arg-type]
    assert stop.looks == 3  # it ended at the first look that said stop, not at the bundle's end
    assert list(into.rglob("*")) == [] and counts["store_bundles"] == 0
    # not told to stop, the same fetch brings the bundle whole
    sources.fetch(version, ref, into, [NODE], stop=threading.Event())  # type: ignore[arg-type]
    assert sorted(p.name for p in into.rglob("*.bin")) == sorted(p.name for p in (tmp_path / "src").iterdir())


def test_a_stopped_peer_body_ends_at_its_next_piece() -> None:
    stop = threading.Event()
    ref = SimpleNamespace(digest="a" * 32, size=1 << 20)
    body = _PeerBody(iter([b"x" * 100, b"y" * 100, b"z" * 100]), 1 << 30, time.monotonic() + 60, 1, ref, stop)  # type: ignore[arg-type]
    assert body.read(1000) == b"x" * 100
    stop.set()
    with pytest.raises(FetchStopped):
        body.read(1000)
    assert body.received == 100  # the next piece was never taken
