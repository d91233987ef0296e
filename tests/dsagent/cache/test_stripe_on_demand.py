"""A share held ``storeOnDemand`` reads the store only for what readers read
(docs/design-striping.md#agent).

Two real agents on loopback TCP, a bundle store over HTTP that counts its reads per bundle,
and the real peer protocol. Each agent holds its share of one version ``storeOnDemand``:

- their fills ask the peers only and read nothing from the store, pass after pass;
- a peer asking an owner for a bundle it misses gets "not here" (404) and causes no store
  read, unless it says a reader waits (:mod:`dsplatform.wire.peerbundle`): then the owner
  reads it from the store, once, and answers "later" (425) meanwhile;
- a reader on one node reads a bundle the other owns: the owner reads it from the store
  once and sends it; a bundle its own node owns is read from the store once into its share;
- whole copies on demand: a reader reading the whole version on one node reads each bundle
  from the store once in all, and the other node's copy fills from it over P2P to whole.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from dsplatform.stripe import owner
from dsplatform.wire.peerbundle import READER_HEADER, READER_WAITS
from tests.dsagent.conftest import write_tree
from tests.dsagent.stripeadmin import admin, share_status
from tools.support.harness import ADMIN_TOKEN, AgentProcess, LoopbackServer, eventually

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.slow  # two agent processes

TOKEN = "peer-token-0123456789abcdef"
NODES = ["node-a", "node-b"]
RETRY = 0.2  # DSAGENT_STRIPE_ON_DEMAND_RETRY: many fill passes within the test


class _Pair(NamedTuple):
    files: dict[str, bytes]
    manifest: Manifest
    store: LoopbackServer
    agents: dict[str, AgentProcess]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[_Pair]:
    """24 files packed 2 to a bundle (12 bundles) in a store over HTTP, and two agents."""
    rng = random.Random(7)
    files = {f"d{i % 3}/f{i:03d}.bin": rng.randbytes(4_000 + rng.randrange(4_000)) for i in range(24)}
    write_tree(tmp_path / "www" / "src", files)
    manifest = pack(tmp_path / "www" / "src", tmp_path / "www" / "store", name="imgs", max_files=2)
    store = LoopbackServer(tmp_path / "www")
    env = {"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_STRIPE_ON_DEMAND_RETRY": str(RETRY)}
    agents = {n: AgentProcess(tmp_path / n, tcp=True, env={**env, "DSAGENT_NODE_NAME": n}) for n in NODES}
    try:
        for agent in agents.values():
            agent.start()
        yield _Pair(files, manifest, store, agents)
    finally:
        for agent in agents.values():
            agent.stop()
        store.close()


def _hold(pair: _Pair, node: str, **extra: Any) -> dict[str, Any]:
    body = {"store": f"{pair.store.url}/store", "members": NODES, "storeOnDemand": True, "readyAfter": 0,
            "peers": {n: a.url for n, a in pair.agents.items()}, **extra}  # fmt: skip
    with admin(pair.agents[node]) as client:
        answer = client.put("/v1/stripes/imgs", json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _store_reads(pair: _Pair) -> dict[str, int]:
    """Bundle digest -> GETs of it from the store."""
    return {p.rsplit("/", 1)[1].split(".")[0]: n for p, n in pair.store.gets(lambda p: "/store/bundles/" in p).items()}


def _read(pair: _Pair, node: str, bundle: str) -> bytes:
    """Bundle ``bundle`` as a reader on ``node`` gets it through its agent (a plain tar)."""
    with admin(pair.agents[node]) as client:
        answer = client.get(f"/v1/stripes/imgs/{pair.manifest.digest}/bundles/{bundle}")
    assert answer.status_code == 200, answer.text
    return answer.content


def _window_bytes(pair: _Pair, node: str) -> int:
    """The ``windowBytes`` of ``imgs`` in ``node``'s inventory."""
    with admin(pair.agents[node]) as client:
        return int(client.get("/v1/inventory").json()["stripes"]["imgs"]["windowBytes"])


def _peer_ask(pair: _Pair, node: str, bundle: str, *, reader: bool) -> int:
    """What ``node``'s agent answers a peer asking for ``bundle`` (with the reader marker or not)."""
    headers = {"Authorization": f"Bearer {TOKEN}", **({READER_HEADER: READER_WAITS} if reader else {})}
    with httpx.Client(timeout=30) as client:
        with client.stream("GET", f"{pair.agents[node].url}/v1/peer/bundles/{bundle}", headers=headers) as answer:
            answer.read()
            return answer.status_code


def _sent(agent: AgentProcess) -> set[str]:
    """The bundles (12-digit digest prefixes) the agent's log says it sent whole to a peer."""
    return set(re.findall(r"sent bundle ([0-9a-f]{12}) to ", agent.log.read_text()))


def _complete(pair: _Pair, node: str) -> bool:
    return bool(share_status(pair.agents[node], "imgs", pair.manifest.digest)["complete"])


def _passes(seconds: float = 10 * RETRY) -> None:
    """Time for several passes of the fills (each asks the peers for every bundle it misses)."""
    time.sleep(seconds)


def _dsctl_hold(pair: _Pair, node: str, *flags: str) -> dict[str, Any]:
    """``dsctl stripe hold`` of the share on ``node``, as an operator runs it."""
    agent = pair.agents[node]
    peers = [arg for n, a in pair.agents.items() for arg in ("--peer", f"{n}={a.url}")]
    members = [arg for n in NODES for arg in ("--member", n)]
    done = subprocess.run(
        [sys.executable, "-m", "dsagent.cli", "stripe", "hold", "imgs", "--store", f"{pair.store.url}/store",
         *members, *peers, *flags, "-o", "json", "--socket", str(agent.socket)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "DSAGENT_ADMIN_TOKEN": ADMIN_TOKEN},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_share_on_demand_reads_the_store_only_for_bundles_a_reader_waits_for(pair: _Pair) -> None:
    digest = pair.manifest.digest
    answers = [_hold(pair, "node-a"), _dsctl_hold(pair, "node-b", "--store-on-demand", "--ready-after", "0")]
    for answer in answers:
        assert answer["storeOnDemand"] is True and answer["readyEnough"] is True  # readyAfter 0: pods start now
    _passes()
    # the fills asked each other and read nothing: nobody has read anything yet
    assert _store_reads(pair) == {}
    for node in NODES:
        status = share_status(pair.agents[node], "imgs", digest)
        assert status["bundlesHeld"] == 0 and not status["complete"] and status["error"] is None, status
    hold = json.loads((pair.agents["node-a"].root / "stripes" / "imgs" / digest / "hold.json").read_text())
    assert hold["storeOnDemand"] is True  # a restarted agent holds it on demand again

    bundles = [b.digest for b in pair.manifest.bundles]
    of_a = [b for b in bundles if owner(b, NODES) == "node-a"]
    of_b = [b for b in bundles if owner(b, NODES) == "node-b"]
    assert len(of_a) >= 3 and len(of_b) >= 2

    # a fill's ask (no marker) of an owner that misses the bundle: 404, no store read there
    assert _peer_ask(pair, "node-a", of_a[0], reader=False) == 404
    _passes(3 * RETRY)
    assert _store_reads(pair) == {}
    # a reader waits for it: "later" while the owner reads it from the store, then the bundle
    assert _peer_ask(pair, "node-a", of_a[0], reader=True) == 425
    eventually(lambda: _peer_ask(pair, "node-a", of_a[0], reader=True) == 200, what="the owner's store read")
    assert _store_reads(pair) == {of_a[0]: 1}
    assert share_status(pair.agents["node-a"], "imgs", digest)["bundlesHeld"] == 1

    # a reader on node-b reads a bundle node-a owns (through node-b's window) and one of its own
    before = _sent(pair.agents["node-a"])
    _read(pair, "node-b", of_a[1])
    assert _sent(pair.agents["node-a"]) - before == {of_a[1][:12]}  # node-a read it for node-b's reader
    _read(pair, "node-b", of_b[0])
    # node-b's inventory counts the bundle its reader took through the window, not its own
    # (the controller weighs it against what a whole copy lacks: docs/design-striping.md#holding)
    sizes = {b.digest: b.size for b in pair.manifest.bundles}
    assert _window_bytes(pair, "node-b") == sizes[of_a[1]]
    assert _window_bytes(pair, "node-a") == 0
    _passes()
    assert _store_reads(pair) == {of_a[0]: 1, of_a[1]: 1, of_b[0]: 1}  # once each, and nothing else
    assert share_status(pair.agents["node-a"], "imgs", digest)["bundlesHeld"] == 2
    assert share_status(pair.agents["node-b"], "imgs", digest)["bundlesHeld"] == 1
    # read again on either node: no store read
    _read(pair, "node-a", of_a[1]), _read(pair, "node-b", of_a[1]), _read(pair, "node-a", of_b[0])
    assert _store_reads(pair) == {of_a[0]: 1, of_a[1]: 1, of_b[0]: 1}


def test_whole_copies_on_demand_read_each_bundle_from_the_store_once_and_fill_from_each_other(pair: _Pair) -> None:
    digest = pair.manifest.digest
    for node in NODES:
        assert _hold(pair, node, whole=True)["holding"] == "whole"
    _passes()
    assert _store_reads(pair) == {}

    bundles = [b.digest for b in pair.manifest.bundles]
    for bundle in bundles[:4]:  # a job that stops early: it read these only
        _read(pair, "node-a", bundle)
    assert _store_reads(pair) == dict.fromkeys(bundles[:4], 1)
    # node-b's copy takes them from node-a (or their owner) over P2P, and nothing else arrives
    eventually(lambda: share_status(pair.agents["node-b"], "imgs", digest)["bundlesHeld"] == 4, what="node-b's copy")
    _passes()
    assert share_status(pair.agents["node-b"], "imgs", digest)["bundlesHeld"] == 4
    assert _store_reads(pair) == dict.fromkeys(bundles[:4], 1)

    for bundle in bundles[4:]:  # the version read to its end
        _read(pair, "node-a", bundle)
    eventually(lambda: all(_complete(pair, node) for node in NODES), what="both copies whole")
    assert _store_reads(pair) == dict.fromkeys(bundles, 1)  # each bundle from the store once in all
    for node in NODES:  # every file, verified, on each node
        share = pair.agents[node].root / "stripes" / "imgs" / digest / "share"
        assert {p.relative_to(share).as_posix(): p.read_bytes() for p in share.rglob("*.bin")} == pair.files
