"""Striped versions with four real agents on loopback and the real peer protocol.

One version, packed into a store served by :class:`LoopbackServer` (which counts GETs), is
2.5 times one agent's capacity. Four ``dsagent serve`` processes each hold their share
(rendezvous hashing over the group) and serve it to the others; a reader per rank
(``dsplatform.data``) reads its samples, its own node's bundles from disk and the others
through its agent. An agent is killed with SIGKILL mid-epoch: the epoch still gives every
sample exactly once.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from dsplatform.data import StripedDataset
from dsplatform.wire import readerenv
from tests.dsagent.conftest import write_tree
from tests.dsplatform.test_data import ranks_in_threads
from tools.support.harness import AgentProcess, LoopbackServer, allocated, held_ports

pytest.importorskip("aiohttp")
pytestmark = [
    pytest.mark.slow,  # four agent processes, one killed; a process's peak memory
    pytest.mark.xdist_group("four-agents"),  # one worker runs them in order: they share the agents and their state
]

TOKEN = "peer-token-0123456789abcdef"
NODES = [f"node-{i}" for i in range(4)]
WINDOW = 64 << 10  # a few bundles: the window turns over many times per epoch


def _files(count: int = 320, seed: int = 5) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"class{i % 7}/img{i:04d}.jpg": rng.randbytes(8000 + rng.randrange(8000)) for i in range(count)}


@pytest.fixture(scope="module")
def striped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A store over HTTP and four agents holding their shares of ``imgs``."""
    tmp = tmp_path_factory.mktemp("stripes")
    files = _files()
    write_tree(tmp / "www" / "src", files)
    manifest = pack(tmp / "www" / "src", tmp / "www" / "store", name="imgs", max_files=2)
    server = LoopbackServer(tmp / "www")
    with held_ports(len(NODES)) as ports:  # kept from other tests until the agents stop
        # the version takes 2.5 times one agent's capacity on disk (the capacity's unit: bytes,
        # blocks and inodes); a share fits it with the fill's 1.2x headroom
        capacity = allocated(manifest.total_bytes, manifest.file_count, tmp) * 2 // 5
        agents = [
            AgentProcess(
                tmp / node,
                tcp=True,
                port=ports[i],
                env={
                    "DSAGENT_NODE_NAME": node,
                    "DSAGENT_PEER_TOKEN": TOKEN,
                    "DSAGENT_CAPACITY": str(capacity),
                    "DSAGENT_STRIPE_WINDOW": str(WINDOW),
                },
            ).start()
            for i, node in enumerate(NODES)
        ]
        peers = {node: agent.url for node, agent in zip(NODES, agents)}
        try:
            for agent in agents:
                answer = _hold(agent, server, peers)
                assert answer["bytesOwned"] <= capacity
            deadline = time.monotonic() + 120
            while not all(_status(a, manifest)["complete"] for a in agents):
                assert time.monotonic() < deadline, [_status(a, manifest) for a in agents]
                time.sleep(0.1)
            yield {"files": files, "manifest": manifest, "server": server, "agents": agents, "capacity": capacity}
        finally:
            for agent in agents:
                agent.stop()
            server.close()


def _admin(agent: AgentProcess) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(agent.socket)), base_url="http://agent", timeout=60)


def _hold(agent: AgentProcess, server: LoopbackServer, peers: dict[str, str]) -> dict[str, Any]:
    with _admin(agent) as client:
        response = client.put(
            "/v1/stripes/imgs", json={"store": f"{server.url}/store", "members": NODES, "peers": peers}
        )
    assert response.status_code == 200, response.text
    return dict(response.json())


def _status(agent: AgentProcess, manifest: Manifest) -> dict[str, Any]:
    with _admin(agent) as client:
        response = client.get(f"/v1/stripes/imgs/{manifest.digest}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _share(agent: AgentProcess, manifest: Manifest) -> Path:
    return agent.root / "stripes" / "imgs" / manifest.digest / "share"


def _reader(setup: dict[str, Any], rank: int, epoch: int, **kw: Any) -> StripedDataset:
    agents: list[AgentProcess] = setup["agents"]
    own = agents[rank]
    return StripedDataset(
        _share(own, setup["manifest"]),
        rank=rank,
        world_size=4,
        rank_nodes=NODES,
        agent=f"unix://{own.socket}",
        fallback=[f"unix://{a.socket}" for a in agents if a is not own],
        seed=11,
        epoch=epoch,
        **kw,
    )


def _bundle_gets(server: LoopbackServer) -> int:
    return sum(server.gets(lambda p: "/store/bundles/" in p).values())


def _ranks_from_env(setup: dict[str, Any], epoch: int) -> list[StripedDataset]:
    """The four ranks as a training job builds them: each from its pod's environment, the
    ranks exchanging their nodes through an all-gather (here among threads)."""
    agents: list[AgentProcess] = setup["agents"]
    manifest: Manifest = setup["manifest"]

    def make(rank: int, gather: Any) -> StripedDataset:
        own = agents[rank]
        environ = {
            "DSAGENT_STRIPES": readerenv.encode([readerenv.Share("imgs", manifest.digest, str(_share(own, manifest)))]),
            "DSAGENT_SOCKET": str(own.socket),
            "DSAGENT_NODE_NAME": NODES[rank],
            "RANK": str(rank),
            "WORLD_SIZE": "4",
        }
        fallback = [f"unix://{a.socket}" for a in agents if a is not own]
        return StripedDataset.from_env(environ=environ, gather=gather, fallback=fallback, seed=11, epoch=epoch)

    *readers, _ = ranks_in_threads(make, 4)
    assert all(r.assignment == _reader(setup, 0, epoch).assignment for r in readers)  # as with rank_nodes
    return readers


def _epoch(setup: dict[str, Any], epoch: int) -> tuple[Counter[str], dict[str, int]]:
    seen: Counter[str] = Counter()
    stats = Counter()
    for reader in _ranks_from_env(setup, epoch):
        for sample in reader:
            assert sample.data == setup["files"][sample.path]
            seen[sample.path] += 1
        stats.update(reader.stats)
    return seen, dict(stats)


def test_each_agent_holds_only_its_share_within_its_capacity(striped: dict[str, Any]) -> None:
    manifest: Manifest = striped["manifest"]
    owned = [_status(a, manifest)["bundlesOwned"] for a in striped["agents"]]
    assert sum(owned) == len(manifest.bundles) and all(owned)
    for agent in striped["agents"]:
        share = _share(agent, manifest)
        held = sum(p.stat().st_size for p in share.rglob("*.jpg"))
        assert held == _status(agent, manifest)["bytesHeld"] <= striped["capacity"]
        with _admin(agent) as client:
            space = client.get("/v1/datasets").json()
        assert held < space["usedBytes"] <= striped["capacity"]  # the share counts its blocks too
        assert (share / "stripe-layout.jsonl").is_file()


def _dsctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsagent.cli", *args], capture_output=True, text=True, timeout=120)


def test_dsctl_reports_a_shares_progress_and_refuses_a_malformed_peer(striped: dict[str, Any]) -> None:
    manifest: Manifest = striped["manifest"]
    agent: AgentProcess = striped["agents"][1]
    done = _dsctl("stripe", "wait", "imgs", manifest.digest, "--until", "complete", "--socket", str(agent.socket))
    owned = _status(agent, manifest)["bundlesOwned"]
    assert done.returncode == 0, done.stderr
    assert f"{owned} of {owned} bundles held" in done.stdout
    bad = _dsctl(
        "stripe", "hold", "imgs", "--store", "x", "--member", "node-1", "--peer", "nourl", "--socket", str(agent.socket)
    )
    assert bad.returncode == 2 and "NODE=URL" in bad.stderr
    # a version that is neither held here nor the store's: gone for good, said at once (exit
    # 15; a version not held *yet* is waited for: test_stripe_superseded.py)
    other = _dsctl("stripe", "wait", "imgs", "0" * 32, "--timeout", "60s", "--socket", str(agent.socket))
    assert other.returncode == 15 and "superseded" in other.stderr, other


def test_every_sample_exactly_once_per_epoch_and_later_epochs_skip_the_store(striped: dict[str, Any]) -> None:
    server: LoopbackServer = striped["server"]
    manifest: Manifest = striped["manifest"]
    total = manifest.total_bytes
    for epoch in range(3):
        before = _bundle_gets(server)
        seen, stats = _epoch(striped, epoch)
        assert set(seen) == set(striped["files"]) and set(seen.values()) == {1}
        store_bundles = _bundle_gets(server) - before
        local = stats["local_bytes"] / total
        print(
            f"epoch {epoch}: local {local:.1%}, through agents {stats['agent_bytes'] / total:.1%},"
            f" store bundle GETs {store_bundles} of {len(manifest.bundles)}"
        )
        if epoch >= 1:
            # the store is read for under 5% of the dataset per epoch: not at all here
            assert store_bundles == 0
        assert local > 0.75
        for agent in striped["agents"]:  # the window stays within its bound; the share is untouched
            window = agent.root / "stripes" / "imgs" / manifest.digest / "window"
            assert sum(p.stat().st_size for p in window.rglob("*") if p.is_file()) <= WINDOW
            assert _status(agent, manifest)["complete"]
            share = _share(agent, manifest)
            assert sum(p.stat().st_size for p in share.rglob("*.jpg")) == _status(agent, manifest)["bytesHeld"]


def test_a_killed_owner_mid_epoch_costs_no_sample(striped: dict[str, Any]) -> None:
    agents: list[AgentProcess] = striped["agents"]
    victim = agents[3]
    seen: Counter[str] = Counter()
    readers = [_reader(striped, rank, 5) for rank in range(4)]
    iterators = [iter(r) for r in readers]
    for it in iterators:  # every rank has started its epoch
        for _ in range(10):
            sample = next(it)
            seen[sample.path] += 1
    victim.kill9()
    for it in iterators:
        for sample in it:
            assert sample.data == striped["files"][sample.path]
            seen[sample.path] += 1
    assert set(seen) == set(striped["files"]) and set(seen.values()) == {1}
    assert readers[3].stats["retries"] >= 1 or readers[3].stats["agent_bytes"] == 0
    victim.start()
    deadline = time.monotonic() + 60  # a restarted agent holds its share again, from its disk
    while True:
        with _admin(victim) as client:
            answer = client.get(f"/v1/stripes/imgs/{striped['manifest'].digest}")
        if answer.status_code == 200 and answer.json()["complete"]:
            break
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.2)


def test_peak_memory_of_a_serving_agent_stays_bounded(striped: dict[str, Any]) -> None:
    manifest: Manifest = striped["manifest"]
    agent: AgentProcess = striped["agents"][0]
    assert agent.proc is not None
    status = Path(f"/proc/{agent.proc.pid}/status")

    def hwm() -> int:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    before = hwm()
    served = 0
    with httpx.Client(timeout=60) as client:
        for _ in range(4):
            for digest in [b.digest for b in manifest.bundles]:
                with client.stream(
                    "GET", f"{agent.url}/v1/peer/bundles/{digest}", headers={"Authorization": f"Bearer {TOKEN}"}
                ) as response:
                    if response.status_code == 404:
                        continue
                    assert response.status_code == 200
                    served += sum(len(c) for c in response.iter_raw())
    grown = hwm() - before
    print(f"agent peak RSS {before / 2**20:.1f} -> {hwm() / 2**20:.1f} MiB after serving {served / 2**20:.1f} MiB")
    assert served > 0
    assert grown < 64 << 20


def _join(striped: dict[str, Any]) -> AgentProcess:
    """A fifth agent, ``node-4``, joins the group; every member holds its new share."""
    server: LoopbackServer = striped["server"]
    manifest: Manifest = striped["manifest"]
    agents: list[AgentProcess] = striped["agents"]
    tmp = agents[0].root.parent
    joiner = AgentProcess(
        tmp / "node-4",
        tcp=True,
        env={"DSAGENT_NODE_NAME": "node-4", "DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_CAPACITY": str(striped["capacity"])},
    ).start()
    agents.append(joiner)  # stopped by the fixture
    members = [*NODES, "node-4"]
    peers = {node: agent.url for node, agent in zip(members, agents)}
    for agent in agents:
        with _admin(agent) as client:
            answer = client.put(
                "/v1/stripes/imgs", json={"store": f"{server.url}/store", "members": members, "peers": peers}
            )
        assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 120
    while not all(_status(a, manifest)["complete"] for a in agents):
        assert time.monotonic() < deadline, [_status(a, manifest) for a in agents]
        time.sleep(0.1)
    return joiner


def test_a_joining_member_takes_its_share_from_the_previous_owners_not_the_store(striped: dict[str, Any]) -> None:
    server: LoopbackServer = striped["server"]
    manifest: Manifest = striped["manifest"]
    agents: list[AgentProcess] = striped["agents"]
    assert len(agents) == len(NODES), "the join runs on the four-member group"
    before = _bundle_gets(server)
    joiner = _join(striped)
    members = [*NODES, "node-4"]
    owned = _status(joiner, manifest)["bundlesOwned"]
    assert owned > 0
    # every bundle the joiner now owns came from the member that owned it before
    assert _bundle_gets(server) == before
    seen: Counter[str] = Counter()
    for rank, agent in enumerate(agents):
        reader = StripedDataset(
            agent.root / "stripes" / "imgs" / manifest.digest / "share",
            rank=rank,
            world_size=5,
            rank_nodes=members,
            agent=f"unix://{agent.socket}",
            seed=2,
        )
        for sample in reader:
            assert sample.data == striped["files"][sample.path]
            seen[sample.path] += 1
    assert set(seen) == set(striped["files"]) and set(seen.values()) == {1}
    assert _bundle_gets(server) == before


def _served(agent: AgentProcess) -> float:
    with agent.client() as client:
        text = client.metrics()
    for line in text.splitlines():
        if line.startswith('dsplatform_agent_peer_bytes_total{direction="served"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_member_serves_peers_only_the_bundles_it_holds(striped: dict[str, Any]) -> None:
    manifest: Manifest = striped["manifest"]
    agent: AgentProcess = striped["agents"][0]
    held = set(_held_bundles(agent, manifest))
    others = [b.digest for b in manifest.bundles if b.digest not in held]
    assert held and others
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{agent.url}/v1/peer/bundles/{others[0]}", headers=headers).status_code == 404
    assert httpx.get(f"{agent.url}/v1/peer/bundles/{sorted(held)[0]}", headers=headers).status_code == 200


def _held_bundles(agent: AgentProcess, manifest: Manifest) -> list[str]:
    return [p.name for p in (_share(agent, manifest) / ".stripe" / "done").iterdir()]


def test_a_draining_members_share_moves_to_the_new_owners_from_it_not_the_store(striped: dict[str, Any]) -> None:
    """The controller lists a leaving member as a peer but not a member: the new owners ask
    it first for the bundles it owned, and the store is not read."""
    server: LoopbackServer = striped["server"]
    manifest: Manifest = striped["manifest"]
    agents: list[AgentProcess] = striped["agents"]
    if len(agents) == len(NODES):  # the join has not run on this worker: drain from five, which four can hold
        _join(striped)
    members_now: list[str] = _status(agents[0], manifest)["members"]
    assert len(members_now) == 5, members_now
    by_node = {node: agents[i] for i, node in enumerate([*NODES, "node-4"][: len(agents)])}
    leaving = members_now[0]  # a member whose bundles no other member held before
    staying = [m for m in members_now if m != leaving]
    assert _held_bundles(by_node[leaving], manifest)
    peers = {node: by_node[node].url for node in members_now}
    gets, served = _bundle_gets(server), _served(by_node[leaving])
    for node in staying:
        with _admin(by_node[node]) as client:
            answer = client.put(
                "/v1/stripes/imgs", json={"store": f"{server.url}/store", "members": staying, "peers": peers}
            )
        assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 120
    while not all(_status(by_node[n], manifest)["complete"] for n in staying):
        assert time.monotonic() < deadline, [_status(by_node[n], manifest) for n in staying]
        time.sleep(0.1)
    assert _bundle_gets(server) == gets  # nothing from the store
    assert _served(by_node[leaving]) > served  # the leaving member's bundles came from it
    held = set().union(*(_held_bundles(by_node[n], manifest) for n in staying))
    assert {b.digest for b in manifest.bundles} <= held
