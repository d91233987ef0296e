"""A stopping agent hands its stripe share off before it goes (docs/design-striping.md#churn).

Real agents on loopback TCP and a bundle store over HTTP. ``node-a`` holds the whole version
alone; the group then becomes ``node-b`` alone with ``node-a`` listed as a peer, as the
controller lists a draining node, and ``node-a`` serves slowly (its uploads throttled). It is
sent SIGTERM once ``node-b`` has started: it takes no new task and fails readiness, keeps
serving the share until ``node-b`` has it whole (no store read), then exits by itself within
its bound. An agent holding no share stops as fast as before; a release ends the hand-off at
once; and a peer that keeps asking does not hold the agent past the bound.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from tests.dsagent.conftest import write_tree
from tests.dsagent.stripeadmin import admin, hold, share_status, until_complete
from tools.support.harness import ADMIN_TOKEN, AgentProcess, LoopbackServer

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.slow  # agent processes

TOKEN = "peer-token-0123456789abcdef"
PEER = {"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_PEER_MIN_RATE": "1000"}  # slow peers are waited for
STOP_DEADLINE = 9.0  # dsagent.nodeagent.serve.STOP_DEADLINE


def _store_reads(server: LoopbackServer) -> int:
    return sum(server.gets(lambda p: "/store/bundles/" in p).values())


def _exit(agent: AgentProcess, timeout: float) -> int:
    assert agent.proc is not None
    try:
        return agent.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the agent did not exit within {timeout:.0f} s:\n{agent.log.read_text()[-3000:]}")


def _ended(agent: AgentProcess) -> str:
    found = re.findall(r"stripe hand-off ended after .*", agent.log.read_text())
    assert len(found) == 1, agent.log.read_text()[-3000:]
    return str(found[0])


@pytest.fixture
def version(tmp_path: Path) -> Iterator[tuple[Manifest, LoopbackServer, str]]:
    """48 bundles of two 20-40 KB files in a store over HTTP: the manifest, the server, the store URL."""
    rng = random.Random(5)
    files = {f"d{i % 5}/f{i:03d}.bin": rng.randbytes(20_000 + rng.randrange(20_000)) for i in range(96)}
    write_tree(tmp_path / "www" / "src", files)
    manifest = pack(tmp_path / "www" / "src", tmp_path / "www" / "store", name="imgs", max_files=2)
    server = LoopbackServer(tmp_path / "www")
    try:
        yield manifest, server, f"{server.url}/store"
    finally:
        server.close()


def _holder(tmp_path: Path, manifest: Manifest, store: str, **env: str) -> AgentProcess:
    """``node-a``, started and holding the whole version (read from the store)."""
    agent = AgentProcess(tmp_path / "node-a", tcp=True, env={**PEER, "DSAGENT_NODE_NAME": "node-a", **env})
    agent.start()
    hold(agent, "imgs", store, ["node-a"], {"node-a": agent.url})
    assert until_complete(agent, "imgs", manifest.digest)["bundlesHeld"] == len(manifest.bundles)
    return agent


def test_a_stopping_agent_serves_its_share_to_the_new_owner_then_exits(
    tmp_path: Path, version: tuple[Manifest, LoopbackServer, str]
) -> None:
    manifest, server, store = version
    # ~1.4 MB served at 400 KB/s: the move takes about 3.5 s, most of it after the signal
    old = _holder(
        tmp_path,
        manifest,
        store,
        DSAGENT_PEER_UPLOAD_RATE="400000",
        DSAGENT_STRIPE_HANDOFF_GRACE="20s",
        DSAGENT_STRIPE_HANDOFF_IDLE="1s",
    )
    new = AgentProcess(tmp_path / "node-b", tcp=True, env={**PEER, "DSAGENT_NODE_NAME": "node-b"})
    try:
        new.start()
        from_store = _store_reads(server)
        hold(new, "imgs", store, ["node-b"], {"node-a": old.url, "node-b": new.url})  # node-a drains
        deadline = time.monotonic() + 30
        while "sent bundle" not in old.log.read_text():  # the move has begun
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert old.proc is not None
        old.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        with httpx.Client(base_url=old.url, timeout=10, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            deadline = time.monotonic() + 5
            while (ready := http.get("/readyz")).status_code == 200:  # the signal arrives
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert ready.status_code == 503 and ready.json()["status"] == "stopping"
            dataset = {"name": "other", "source": f"{server.url}/src", "bundles": store}
            refused = http.put("/v1/tasks/t1", json={"datasets": [dataset]})
            assert refused.status_code == 503 and refused.json()["code"] == "agent_stopping", refused.text
        assert share_status(new, "imgs", manifest.digest)["complete"] is False, (
            "the move ended before the signal: nothing tested"
        )

        status = until_complete(new, "imgs", manifest.digest)
        assert status["error"] is None and status["bundlesHeld"] == len(manifest.bundles)
        assert _store_reads(server) == from_store, "the new owner read the store: the hand-off was cut short"

        code = _exit(old, 20 + STOP_DEADLINE)
        took = time.monotonic() - signalled
        assert code in (0, -signal.SIGTERM), code  # a graceful stop (uvicorn re-raises the signal)
        assert took < 20, f"exited after {took:.1f} s, past the bound"
        ended = _ended(old)
        assert "no peer asked for a bundle for the idle window" in ended, ended
        assert int(re.findall(r"(\d+) bundles sent to peers", ended)[0]) > 0, ended
    finally:
        new.stop(), old.stop()


def test_an_agent_holding_no_share_stops_at_once(tmp_path: Path) -> None:
    # the agent's own default bound (the harness turns the hand-off off)
    agent = AgentProcess(tmp_path / "plain", tcp=True, env={**PEER, "DSAGENT_STRIPE_HANDOFF_GRACE": "570s"}).start()
    assert agent.proc is not None
    started = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    code = _exit(agent, 30)
    took = time.monotonic() - started
    assert code in (0, -signal.SIGTERM), code
    # at once, not after the 570 s grace: a bound a loaded test machine's process exit cannot reach
    assert took < 20, f"SIGTERM took {took:.1f} s"
    assert "stripe hand-off" not in agent.log.read_text()


def test_a_release_ends_the_hand_off_at_once(tmp_path: Path, version: tuple[Manifest, LoopbackServer, str]) -> None:
    manifest, _, store = version
    agent = _holder(tmp_path, manifest, store, DSAGENT_STRIPE_HANDOFF_GRACE="60s")
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while "stopping: serving" not in agent.log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    released = time.monotonic()
    with admin(agent) as client:  # what the controller does once the new owners are complete
        assert client.delete("/v1/stripes/imgs").status_code == 200
    code = _exit(agent, 30)
    assert code in (0, -signal.SIGTERM), code
    assert time.monotonic() - released < 20  # at once, not after the 60 s grace
    assert "it holds no stripe share bundle" in _ended(agent)


def test_a_peer_that_keeps_asking_does_not_hold_the_agent_past_the_bound(
    tmp_path: Path, version: tuple[Manifest, LoopbackServer, str]
) -> None:
    manifest, _, store = version
    agent = _holder(tmp_path, manifest, store, DSAGENT_STRIPE_HANDOFF_GRACE="3s", DSAGENT_STRIPE_HANDOFF_IDLE="500ms")
    assert agent.proc is not None
    stop = threading.Event()
    asked: list[int] = []

    def keep_asking() -> None:  # one bundle after another, for ever
        with httpx.Client(base_url=agent.url, timeout=5, headers={"authorization": f"Bearer {TOKEN}"}) as http:
            while not stop.is_set():
                try:
                    asked.append(http.get(f"/v1/peer/bundles/{manifest.bundles[0].digest}").status_code)
                except httpx.HTTPError:
                    return  # the agent is gone
                time.sleep(0.05)

    peer = threading.Thread(target=keep_asking, daemon=True)
    peer.start()
    try:
        while not asked:
            time.sleep(0.02)
        started = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        code = _exit(agent, 3 + STOP_DEADLINE)
        took = time.monotonic() - started
    finally:
        stop.set()
        peer.join(10)
    assert code in (0, -signal.SIGTERM), code
    assert 3 <= took < 3 + STOP_DEADLINE, f"exited after {took:.1f} s"
    assert "the hand-off bound passed" in _ended(agent)
    assert asked.count(200) > 10  # it served the peer all along
