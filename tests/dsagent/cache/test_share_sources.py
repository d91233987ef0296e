"""A whole copy and a stripe group's share take each other's bundles, not the store's.

Two real agents on loopback TCP and a bundle store over HTTP.

- ``node-a`` holds a share of the version (its inventory lists it under ``stripes``);
  ``node-b`` then caches the same version whole with ``node-a`` as its peer. Each bundle
  ``node-a`` holds comes from it; the others (owned by a member that is not there) come
  from the store, once each.
- The other way: ``node-b`` holds the version whole (ready, or still fetching it) and
  ``node-a`` then holds a share of it. The share's bundles come from the whole copy; while
  both fetch at once, every bundle is read from the store once in all.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from dsplatform.stripe import LAYOUT_FILE, StripeLayout
from dsplatform.wire.inventory import holds
from tests.dsagent.conftest import write_tree
from tools.support.harness import AgentProcess, LoopbackServer, held_ports, wait_ready

pytestmark = pytest.mark.slow  # two agent processes

TOKEN = "peer-token-0123456789abcdef"


def _share_status(agent: AgentProcess, digest: str) -> dict[str, Any]:
    transport = httpx.HTTPTransport(uds=str(agent.socket))
    deadline = time.monotonic() + 60
    while True:
        with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as client:
            status = dict(client.get(f"/v1/stripes/imgs/{digest}").json())
        if status["complete"] or status["error"]:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def _hold(agent: AgentProcess, store: str, members: list[str]) -> None:
    transport = httpx.HTTPTransport(uds=str(agent.socket))
    with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as client:
        held = client.put("/v1/stripes/imgs", json={"store": store, "members": members, "peers": {}})
    assert held.status_code == 200, held.text


def _bundle_gets(server: LoopbackServer) -> dict[str, int]:
    return {p.rsplit("/", 1)[1].split(".")[0]: n for p, n in server.gets(lambda p: "/store/bundles/" in p).items()}


def _served(tmp_path: Path, *, seed: int) -> tuple[dict[str, bytes], Manifest, LoopbackServer]:
    """48 files of 8-16 KB packed 3 to a bundle under ``www/store``, served over HTTP."""
    rng = random.Random(seed)
    files = {f"d{i % 4}/f{i:03d}.bin": rng.randbytes(8_000 + rng.randrange(8_000)) for i in range(48)}
    write_tree(tmp_path / "www" / "src", files)
    manifest = pack(tmp_path / "www" / "src", tmp_path / "www" / "store", name="imgs", max_files=3)
    return files, manifest, LoopbackServer(tmp_path / "www")


class _Pair(NamedTuple):
    files: dict[str, bytes]
    manifest: Manifest
    server: LoopbackServer
    store: str
    copy: AgentProcess  # node-b: the whole copy
    member: AgentProcess  # node-a: the share


@contextlib.contextmanager
def _two_agents(tmp_path: Path, *, slow_store: float = 0.0) -> Iterator[_Pair]:
    """``node-b`` (a whole copy) and ``node-a`` (a share), started, each listing the other as its peer."""
    files, manifest, server = _served(tmp_path, seed=7)
    if slow_store:
        server.slow_down(lambda p: "/store/bundles/" in p, slow_store)
    common = {"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_FETCH_WORKERS": "4"}
    with held_ports(2) as (port_a, port_b):  # kept from other tests until the agents stop
        copy = AgentProcess(
            tmp_path / "node-b",
            tcp=True,
            port=port_b,
            env={**common, "DSAGENT_NODE_NAME": "node-b", "DSAGENT_PEERS": f"http://127.0.0.1:{port_a}"},
        )
        member = AgentProcess(
            tmp_path / "node-a",
            tcp=True,
            port=port_a,
            env={**common, "DSAGENT_NODE_NAME": "node-a", "DSAGENT_PEERS": f"http://127.0.0.1:{port_b}"},
        )
        try:
            copy.start()
            member.start()
            yield _Pair(files, manifest, server, f"{server.url}/store", copy, member)
        finally:
            member.stop()
            copy.stop()
            server.close()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*.bin")}


def _cache_whole(pair: _Pair, *, then: Callable[[], None] = lambda: None) -> None:
    with pair.copy.client(token=None) as client:
        client.submit_task("t", [{"name": "imgs", "source": f"{pair.server.url}/nowhere", "bundles": pair.store}])
        then()
        assert wait_ready(client, "t")["state"] == "ready"


def _share_complete(pair: _Pair) -> None:
    status = _share_status(pair.member, pair.manifest.digest)
    assert status["error"] is None and status["complete"], status
    assert _tree(pair.member.root / "stripes" / "imgs" / pair.manifest.digest / "share") == pair.files


def test_a_share_takes_its_bundles_from_a_whole_copy_not_the_store(tmp_path: Path) -> None:
    with _two_agents(tmp_path) as pair:
        _cache_whole(pair)
        before = _bundle_gets(pair.server)
        assert set(before) == {b.digest for b in pair.manifest.bundles}
        _hold(pair.member, pair.store, ["node-a"])  # a group of one: node-a owns every bundle
        _share_complete(pair)
        assert _bundle_gets(pair.server) == before, "a bundle of the share was read from the store again"


def test_a_share_and_a_whole_copy_fetched_at_once_read_each_bundle_from_the_store_once(tmp_path: Path) -> None:
    with _two_agents(tmp_path, slow_store=0.4) as pair:  # both fetches overlap

        def hold_meanwhile() -> None:  # once the copy is under way, as its inventory says
            deadline = time.monotonic() + 30
            while holds(httpx.get(f"{pair.copy.url}/v1/inventory").json(), "imgs", pair.manifest.digest) != "fetching":
                assert time.monotonic() < deadline, "the whole copy never showed as fetching"
                time.sleep(0.02)
            _hold(pair.member, pair.store, ["node-a"])

        _cache_whole(pair, then=hold_meanwhile)
        _share_complete(pair)
        gets = _bundle_gets(pair.server)
        assert set(gets) == {b.digest for b in pair.manifest.bundles}
        assert all(n == 1 for n in gets.values()), gets
        assert _tree(pair.copy.root / "datasets" / "imgs" / pair.manifest.digest) == pair.files


def test_a_whole_copy_reads_a_members_bundles_from_it_and_only_the_rest_from_the_store(tmp_path: Path) -> None:
    files, manifest, server = _served(tmp_path, seed=5)
    store = f"{server.url}/store"
    member = AgentProcess(
        tmp_path / "node-a", tcp=True, env={"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_NODE_NAME": "node-a"}
    )
    member.start()
    reader = AgentProcess(
        tmp_path / "node-b",
        tcp=True,
        env={"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_NODE_NAME": "node-b", "DSAGENT_PEERS": member.url},
    )
    try:
        reader.start()
        members = ["node-a", "node-x"]  # node-x is not there: its bundles exist only in the store
        transport = httpx.HTTPTransport(uds=str(member.socket))
        with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as client:
            held = client.put("/v1/stripes/imgs", json={"store": store, "members": members, "peers": {}})
        assert held.status_code == 200, held.text
        status = _share_status(member, manifest.digest)
        assert status["error"] is None
        with open(member.root / "stripes" / "imgs" / manifest.digest / "share" / LAYOUT_FILE, "rb") as stream:
            owned = {b.digest for b in StripeLayout.load(stream).held_by("node-a")}
        assert 0 < len(owned) < len(manifest.bundles), "the test needs bundles on both sides"
        before = dict(server.gets(lambda p: "/store/bundles/" in p))

        with reader.client(token=None) as client:
            client.submit_task("t", [{"name": "imgs", "source": f"{server.url}/nowhere", "bundles": store}])
            record = wait_ready(client, "t")
        assert record["state"] == "ready", record
        after = dict(server.gets(lambda p: "/store/bundles/" in p))
        read = {path for path, n in after.items() if n > before.get(path, 0)}
        # every bundle the member holds came from it; each other one from the store, once
        assert {p.rsplit("/", 1)[1].split(".")[0] for p in read} == {b.digest for b in manifest.bundles} - owned
        assert all(after[p] - before.get(p, 0) == 1 for p in read)
        version = reader.root / "datasets" / "imgs" / manifest.digest
        assert {p.relative_to(version).as_posix(): p.read_bytes() for p in version.rglob("*.bin")} == files
    finally:
        reader.stop()
        member.stop()
        server.close()


def _peer_404s(agent: AgentProcess) -> float:
    """The peer bundle requests ``agent`` answered 404 (a bundle it does not hold)."""
    text = httpx.get(f"{agent.url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dsplatform_agent_http_request_duration_seconds_count")
        and 'route="/v1/peer/bundles/{digest}"' in line
        and 'status="404"' in line
    )


def test_a_whole_copy_asks_each_bundle_of_its_owner_in_the_group_first(tmp_path: Path) -> None:
    """Two members hold their shares; a third agent caches the version whole with both as
    its peers. Their inventories list the group, so it asks each bundle's owner first: no
    member answers 404, and the store is not read."""
    files, manifest, server = _served(tmp_path, seed=11)
    store = f"{server.url}/store"
    env = {"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_FETCH_WORKERS": "4"}
    members = [AgentProcess(tmp_path / n, tcp=True, env={**env, "DSAGENT_NODE_NAME": n}) for n in ("node-a", "node-c")]
    agents = list(members)
    try:
        for member in members:
            member.start()
        for member in members:
            _hold(member, store, ["node-a", "node-c"])
        for member in members:
            assert _share_status(member, manifest.digest)["error"] is None
        before = dict(server.gets(lambda p: "/store/bundles/" in p))
        peers = ",".join(m.url for m in reversed(members))  # the wrong member first for some bundles
        copy = AgentProcess(
            tmp_path / "node-b", tcp=True, env={**env, "DSAGENT_NODE_NAME": "node-b", "DSAGENT_PEERS": peers}
        )
        agents.append(copy)
        copy.start()
        with copy.client(token=None) as client:
            client.submit_task("t", [{"name": "imgs", "source": f"{server.url}/nowhere", "bundles": store}])
            assert wait_ready(client, "t")["state"] == "ready"
        assert dict(server.gets(lambda p: "/store/bundles/" in p)) == before, "the store was read"
        assert [_peer_404s(m) for m in members] == [0, 0]
        version = copy.root / "datasets" / "imgs" / manifest.digest
        assert {p.relative_to(version).as_posix(): p.read_bytes() for p in version.rglob("*.bin")} == files
    finally:
        for agent in reversed(agents):
            agent.stop()
        server.close()
