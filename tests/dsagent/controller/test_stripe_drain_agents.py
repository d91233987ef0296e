"""A drain of a stripe group member, end to end: the real Dataset controller on the fake API
server, its real ``agent_call`` (HTTP with the admin token) reaching real agents.

Four agents, each on its own loopback address (127.0.0.2 to .5) and one shared port, as
agent pods have one ``agent_port`` and each its pod IP; a bundle store over HTTP that
counts its reads per bundle. The Dataset asks for a group of three. Once the group is
Ready, one member's node is cordoned and the controller runs until the drain settles
(docs/design-striping.md#churn):

- the leaving node's bundles reach their new owners from the leaving agent over P2P (its
  log names each bundle it sent), and the store is not read while the share moves;
- the leaving share is released only when every new owner holds its share whole, and is
  gone from the leaving agent afterwards;
- ``status.stripe`` is Ready with the new members, ``drain.state`` Moved, and the Events
  ``StripeShareMoving`` and ``StripeShareMoved`` are recorded.

And the crash path: the leaving agent, serving slowly, is killed (SIGKILL) while the share
moves and its pod goes; the drain ends (``Ended``), the new owners finish from the store,
and no member is reported ready before its agent holds its share whole.

And the choice of the group from what the agents publish: a job's node whose small cache
holds another dataset's only copy joins without a share (docs/design-striping.md#group),
keeps that copy, and reads the version through its window from the owners.

The agents run in cluster mode against the fake API server: each publishes its own node's
inventory (its room, and its share of the version once it holds one), and the controller
chooses and keeps the group from those, as it does in a cluster; the leaving agent reads
its own Node to learn that it is cordoned.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from dsagent.controller.agents import AgentCall
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.reconcile import DatasetController
from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from dsplatform.stripe import owner
from tests.clock import Clock
from tests.dsagent.conftest import write_tree
from tests.dsagent.controller.test_controller import NS, agent_pod
from tools.support.fake_apiserver import FakeApiServer, make_dataset, make_node
from tools.support.harness import ADMIN_TOKEN, AgentProcess, LoopbackServer, eventually, held_port

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.slow  # four agent processes

TOKEN = "peer-token-0123456789abcdef"
NODES = ("n1", "n2", "n3", "n4")
GB = 1 << 30
#: every agent serves peers at 16 KB/s (a bundle of two files takes about a second) and waits
#: for slow peers: a move takes long enough to be cut short
SLOW_PEERS = {"DSAGENT_PEER_UPLOAD_RATE": "16000", "DSAGENT_PEER_MIN_RATE": "1000"}
SETTLED = ("Moved", "TimedOut", "Ended")  # the drain states that end a move


class _Group(NamedTuple):
    manifest: Manifest
    store: LoopbackServer
    agents: dict[str, AgentProcess]
    ctl: DatasetController
    clock: Clock
    calls: _Observed


class _Observed:
    """The controller's real ``agent_call``, each call recorded; when a share is released,
    what every agent held of the version just before (read from the agents themselves)."""

    def __init__(self, real: AgentCall, agents: dict[str, AgentProcess], digest: str) -> None:
        self.real, self.agents, self.digest = real, agents, digest
        self.calls: list[tuple[str, str, str, int | None]] = []
        # (released node, every agent's share of the version just before: its own included)
        self.released: list[tuple[str, dict[str, dict[str, Any] | None]]] = []

    def __call__(self, node: str, method: str, path: str, body: Any, who: str) -> tuple[int, Any] | None:
        # every call acts for the Dataset, but the orphan sweep's listing, which acts for no one
        assert who == "ml/imgs" or (method, who) == ("GET", "") and path in ("/v1/tasks", "/v1/preparations")
        if method == "DELETE" and path.startswith("/v1/stripes/"):
            self.released.append((node, {n: _share(a, self.digest) for n, a in self.agents.items()}))
        answer = self.real(node, method, path, body, who)
        self.calls.append((node, method, path, None if answer is None else answer[0]))
        return answer


def _share(agent: AgentProcess, digest: str) -> dict[str, Any] | None:
    """The agent's share of ``imgs`` (its own status route), None when it holds none or is gone."""
    if agent.proc is None or agent.proc.poll() is not None:
        return None
    transport = httpx.HTTPTransport(uds=str(agent.socket))
    with httpx.Client(transport=transport, base_url="http://agent", timeout=30) as client:
        answer = client.get(f"/v1/stripes/imgs/{digest}")
    return dict(answer.json()) if answer.status_code == 200 else None


def _store_reads(server: LoopbackServer) -> dict[str, int]:
    """Bundle digest -> GETs of it from the store."""
    return {p.rsplit("/", 1)[1].split(".")[0]: n for p, n in server.gets(lambda p: "/store/bundles/" in p).items()}


def _reads_since(server: LoopbackServer, before: dict[str, int]) -> dict[str, int]:
    """Bundle digest -> GETs of it from the store since ``before`` (:func:`_store_reads`), where any."""
    now = _store_reads(server)
    return {b: n - before.get(b, 0) for b, n in now.items() if n > before.get(b, 0)}


def _sent(agent: AgentProcess) -> set[str]:
    """The bundles (12-digit digest prefixes) the agent's log says it sent whole to a peer."""
    return set(re.findall(r"sent bundle ([0-9a-f]{12}) to ", agent.log.read_text()))


def _stripe(apiserver: FakeApiServer) -> dict[str, Any]:
    dataset = apiserver.get("datasets", "imgs", "ml")
    assert dataset is not None
    return dict(dataset["status"].get("stripe") or {})


def _reconcile_until(
    group: _Group,
    apiserver: FakeApiServer,
    done: Callable[[dict[str, Any]], bool],
    *,
    after: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Controller passes (its clock one second on each) until ``done(status.stripe)``."""
    deadline = time.monotonic() + 60
    while True:
        group.ctl.reconcile_all()
        group.clock.now += 1
        stripe = _stripe(apiserver)
        after()
        if done(stripe):
            return stripe
        assert time.monotonic() < deadline, stripe
        time.sleep(0.1)


@contextlib.contextmanager
def _group(
    tmp_path: Path,
    apiserver: FakeApiServer,
    api_client: Any,
    *,
    env: dict[str, str] | None = None,
    node_env: dict[str, dict[str, str]] | None = None,
    local_sources: tuple[Path, ...] = (),
    stripe: Any = None,
) -> Iterator[_Group]:
    """48 files of 8-16 KB packed 2 to a bundle (24 bundles) in a store over HTTP, four agents,
    the Dataset with ``spec.stripe`` (``{members: 3}`` unless ``stripe`` says), and the controller; ``env`` is added to
    every agent's settings (the leaving one is only known once the group is chosen)."""
    rng = random.Random(11)
    files = {f"d{i % 4}/f{i:03d}.bin": rng.randbytes(8_000 + rng.randrange(8_000)) for i in range(48)}
    write_tree(tmp_path / "www" / "src", files)
    manifest = pack(tmp_path / "www" / "src", tmp_path / "www" / "store", name="imgs", max_files=2)
    store = LoopbackServer(tmp_path / "www")
    with held_port() as port:  # kept from other tests until the agents stop
        kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
        in_cluster = {
            "DSAGENT_KUBERNETES": "1",
            "KUBECONFIG": str(kubeconfig),
            "DSAGENT_PUBLISH_INTERVAL": "200ms",
            # the machine's own disk fullness must not decide the group (tests/dsagent/cache/test_disk_floor.py)
            "DSAGENT_RESERVE": "0",
            "DSAGENT_NODEFS_AVAILABLE": "0",
        }
        agents = {
            node: AgentProcess(
                tmp_path / node,
                tcp=True,
                host=f"127.0.0.{i + 2}",
                port=port,
                env={
                    "DSAGENT_NODE_NAME": node,
                    "DSAGENT_PEER_TOKEN": TOKEN,
                    **in_cluster,
                    **(env or {}),
                    **(node_env or {}).get(node, {}),
                },
                local_sources=local_sources,
            )  # fmt: skip
            for i, node in enumerate(NODES)
        }
        try:
            for node, agent in agents.items():
                apiserver.create(make_node(node, address=agent.host))  # peers look each other up by it
                apiserver.create(agent_pod(node, ip=agent.host))
            for agent in agents.values():
                agent.start()
            eventually(lambda: all(_inventory(apiserver, node) for node in NODES), what="every agent's inventory")
            status = {"digest": manifest.digest, "bytes": manifest.total_bytes, "files": len(files)}
            ds = make_dataset("imgs", namespace="ml", bundles=f"{store.url}/store", status=status)
            ds["spec"]["stripe"] = stripe if stripe is not None else {"members": 3}
            apiserver.create(ds)
            settings = ControllerSettings.model_validate(
                {
                    "namespace": NS,
                    "identity": "c-1",
                    "admin_token": ADMIN_TOKEN,
                    "agent_port": port,
                    "stripe_drain_timeout_s": 600,
                    # the controller's clock is moved past the drain bound by hand; the agents date
                    # their inventories by the wall clock: they must not look stale for that
                    "inventory_max_age": 3600,
                }
            )
            clock = Clock()
            clock.now = time.time()  # the agents date their inventories by the wall clock
            ctl = DatasetController(api_client, settings, clock=clock)
            calls = _Observed(ctl.agent_call, agents, manifest.digest)  # the real one: HTTP to the agents
            ctl.agent_call = calls
            yield _Group(manifest, store, agents, ctl, clock, calls)
        finally:
            for agent in agents.values():
                agent.stop()
            store.close()


def _inventory(apiserver: FakeApiServer, node: str) -> dict[str, Any] | None:
    """What the node's agent last published (its NodeCache's inventory), None before it has."""
    found = apiserver.get("nodecaches", node)
    text = ((found or {}).get("status") or {}).get("inventory")
    return json.loads(text) if text else None


def _cordon_busiest(group: _Group, apiserver: FakeApiServer) -> tuple[list[str], str, list[str]]:
    """Once the group is Ready (:func:`_ready_group`), the member owning the most bundles (the
    most that could come from the store instead of over P2P) is cordoned, as ``kubectl
    cordon`` does: the members, the leaving one and its bundles' digests."""
    members = _ready_group(group, apiserver)
    bundles = [b.digest for b in group.manifest.bundles]
    leaving = max(members, key=lambda m: sum(owner(b, members) == m for b in bundles))
    apiserver.patch("nodes", leaving, {"spec": {"unschedulable": True}})
    return members, leaving, [b for b in bundles if owner(b, members) == leaving]


def _ready_group(group: _Group, apiserver: FakeApiServer) -> list[str]:
    """Passes until the group is Ready; its members, each holding its share whole (asked of
    the agents themselves), every bundle read from the store once."""
    stripe = _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
    members = [n["node"] for n in stripe["nodes"]]
    assert len(members) == 3
    shares = {m: _share(group.agents[m], group.manifest.digest) for m in members}
    assert all(s is not None and s["complete"] and s["error"] is None for s in shares.values()), shares
    assert sum(s["bundlesOwned"] for s in shares.values() if s) == len(group.manifest.bundles)
    assert _store_reads(group.store) == {b.digest: 1 for b in group.manifest.bundles}
    return members


def test_a_cordoned_members_share_moves_to_its_new_owners_over_p2p(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    # peers served at 150 KB/s: the move takes about a second, so a share released before the
    # new owners are whole is seen so
    with _group(tmp_path, apiserver, api_client, env={"DSAGENT_PEER_UPLOAD_RATE": "150000"}) as group:
        old, leaving, theirs = _cordon_busiest(group, apiserver)
        reads_before = _store_reads(group.store)  # nothing read since: no pass has seen the cordon

        stripe = _reconcile_until(group, apiserver, lambda s: (s.get("drain") or {}).get("state") in SETTLED)
        assert stripe["drain"]["state"] == "Moved", stripe
        new = [n["node"] for n in stripe["nodes"]]
        # released once, and only when every new owner held its share whole
        [(released, shares)] = group.calls.released
        assert released == leaving
        assert all((shares[n] or {}).get("complete") for n in new), shares
        assert (shares[leaving] or {}).get("members") == old  # it held its old share until then

        assert leaving not in new and len(new) == 3 and set(new) == set(NODES) - {leaving}
        assert stripe["state"] == "Ready" and all(n["state"] == "ready" for n in stripe["nodes"])
        assert stripe["drain"]["nodes"] == [leaving]
        # every bundle the leaving node owned came from it over P2P; none from the store
        assert {b[:12] for b in theirs} <= _sent(group.agents[leaving]), "a moved bundle was not sent by its old owner"
        assert _store_reads(group.store) == reads_before, "the store was read while the share moved"
        assert _share(group.agents[leaving], group.manifest.digest) is None  # the leaving share is gone
        for node in new:
            share = _share(group.agents[node], group.manifest.digest)
            assert share is not None and share["complete"] and share["members"] == new
        reasons = [e["reason"] for e in apiserver.list("events")]
        assert "StripeShareMoving" in reasons and "StripeShareMoved" in reasons
        # settled: the leaving agent is asked for nothing more for the Dataset (the orphan
        # sweep's listings, which act for no one, ask each agent in its turn, drained or not)
        group.calls.calls.clear()
        group.ctl.reconcile_all()
        sweep = {("GET", "/v1/tasks"), ("GET", "/v1/preparations")}
        assert leaving not in {node for node, method, path, _ in group.calls.calls if (method, path) not in sweep}
        assert _stripe(apiserver)["drain"]["state"] == "Moved"


def test_a_leaving_agent_killed_mid_move_ends_the_drain_and_the_store_fills_in(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    # the move is still under way when the leaving agent is killed
    with _group(tmp_path, apiserver, api_client, env=SLOW_PEERS) as group:
        _, leaving, theirs = _cordon_busiest(group, apiserver)
        agent = group.agents[leaving]
        stripe = _reconcile_until(group, apiserver, lambda s: (s.get("drain") or {}).get("state") == "Moving")
        new = [n["node"] for n in stripe["nodes"]]
        deadline = time.monotonic() + 30
        while not _sent(agent):  # the move has begun: a bundle is across
            assert time.monotonic() < deadline
            time.sleep(0.05)
        reads_before = _store_reads(group.store)
        agent.kill9()
        sent = _sent(agent)
        assert not {b[:12] for b in theirs} <= sent, "the move finished before the kill: nothing to test"
        apiserver.delete("pods", f"agent-{leaving}", NS)  # its pod is gone with it (evicted by the drain)

        def nothing_ready_that_is_not_whole() -> None:
            for report in _stripe(apiserver).get("nodes") or []:
                if report["state"] == "ready":
                    share = _share(group.agents[report["node"]], group.manifest.digest)
                    assert share is not None and share["complete"], (report, share)

        stripe = _reconcile_until(
            group,
            apiserver,
            lambda s: s.get("state") == "Ready" and (s.get("drain") or {}).get("state") in SETTLED,
            after=nothing_ready_that_is_not_whole,
        )
        assert stripe["drain"]["state"] == "Ended" and stripe["drain"]["nodes"] == [leaving]
        assert sorted(n["node"] for n in stripe["nodes"]) == sorted(new)  # the same group, in any order
        for node in new:
            share = _share(group.agents[node], group.manifest.digest)
            assert share is not None and share["complete"] and share["error"] is None
        # the bundles it had not sent came from the store, once each; nothing else did (a bundle
        # it logged as sent may still have been cut in the kernel's buffers: read at most once)
        added = _reads_since(group.store, reads_before)
        unsent = [b for b in theirs if b[:12] not in sent]
        assert set(added) <= set(theirs) and all(n == 1 for n in added.values()), (added, theirs)
        assert set(unsent) <= set(added), (unsent, added)
        assert group.calls.released == []  # nothing left to release: the leaving node is gone
        reasons = [e["reason"] for e in apiserver.list("events")]
        assert "StripeShareMoving" in reasons and "StripeShareMoved" not in reasons


def test_a_move_past_its_bound_releases_the_leaving_share_and_the_store_fills_in(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    # the move is still under way when the controller's clock passes stripe_drain_timeout_s
    # (600 s); the leaving share is released anyway, and the new owners read from the store
    # what they still miss, once each
    with _group(tmp_path, apiserver, api_client, env=SLOW_PEERS) as group:
        _, leaving, theirs = _cordon_busiest(group, apiserver)
        reads_before = _store_reads(group.store)
        _reconcile_until(group, apiserver, lambda s: (s.get("drain") or {}).get("state") == "Moving")
        assert group.calls.released == []
        group.clock.now += 601  # the bound passes with the move under way
        stripe = _reconcile_until(group, apiserver, lambda s: (s.get("drain") or {}).get("state") in SETTLED)
        assert stripe["drain"]["state"] == "TimedOut", stripe
        assert "fell back to the store" in stripe["drain"]["message"]
        [(released, shares)] = group.calls.released
        assert released == leaving
        new = [n["node"] for n in stripe["nodes"]]
        assert not all((shares[n] or {}).get("complete") for n in new), "the move finished in time: nothing tested"
        warning = next(e for e in apiserver.list("events") if e["reason"] == "StripeShareMoveTimedOut")
        assert warning["type"] == "Warning"

        stripe = _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
        for node in new:
            share = _share(group.agents[node], group.manifest.digest)
            assert share is not None and share["complete"] and share["error"] is None
        assert _share(group.agents[leaving], group.manifest.digest) is None
        # what did not come over P2P came from the store, each bundle once, and only its bundles
        added = _reads_since(group.store, reads_before)
        assert added and set(added) <= set(theirs) and all(n == 1 for n in added.values()), (added, theirs)


def test_a_job_node_full_of_last_copies_joins_without_a_share_and_keeps_them(
    tmp_path: Path, apiserver: FakeApiServer, api_client: Any
) -> None:
    from tools.support.fake_apiserver import make_pod

    # n1 runs the job, and its small cache (400 KB) holds the only copy of another dataset
    # (256 KB): it has less room than a share of imgs asks (1.2 x 576 KB / 3, the agent's
    # headroom) but by evicting that copy
    other = write_tree(tmp_path / "nfs" / "other", {f"o{i}.bin": random.Random(i).randbytes(64_000) for i in range(4)})
    small = {"n1": {"DSAGENT_CAPACITY": "400KB"}}
    with _group(tmp_path, apiserver, api_client, node_env=small, local_sources=(tmp_path / "nfs",)) as group:
        n1 = group.agents["n1"]
        with httpx.Client(base_url=n1.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as op:
            body = {"datasets": [{"name": "other", "source": str(other)}]}
            assert op.put("/v1/tasks/warm.other", params={"wait": 30}, json=body).status_code == 200
            assert op.delete("/v1/tasks/warm.other").status_code == 200  # idle: evictable, and the last copy
        eventually(
            lambda: ((_inventory(apiserver, "n1") or {}).get("datasets") or {}).get("other"), what="n1's copy published"
        )
        apiserver.create(
            make_pod("train-0", namespace="ml", node_name="n1", annotations={"dsagent.io/datasets": "imgs"})
        )

        stripe = _reconcile_until(group, apiserver, lambda s: s.get("state") == "Ready")
        nodes = {n["node"]: n for n in stripe["nodes"]}
        assert nodes["n1"].get("share") is False and nodes["n1"]["bytesOwned"] == 0
        owners = [n for n in nodes if n != "n1"]
        assert len(owners) == 3  # the Dataset's three owners, none of them n1
        assert sum(nodes[n]["bytesOwned"] for n in owners) == group.manifest.total_bytes
        share = _share(n1, group.manifest.digest)
        assert share is not None and share["complete"] and share["bundlesOwned"] == 0
        # n1 kept the other dataset's only copy
        with httpx.Client(base_url=n1.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as op:
            assert [v["state"] for v in op.get("/v1/datasets/other").json()["versions"]] == ["ready"]
            # and reads the version through its window, from the owners over P2P
            before = _store_reads(group.store)
            bundle = group.manifest.bundles[0]
            read = op.get(f"/v1/stripes/imgs/{group.manifest.digest}/bundles/{bundle.digest}")
            assert read.status_code == 200, read.text
        assert _store_reads(group.store) == before  # not from the store
        assert _store_reads(group.store) == {b.digest: 1 for b in group.manifest.bundles}
