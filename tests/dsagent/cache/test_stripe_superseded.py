"""A pod pinned to a striped version that another version replaced in the store is told so at once.

One real agent process (unix socket), a bundle store over HTTP on loopback, ``dsctl stripe
wait`` and the reader as a pod runs them. The store keeps one manifest per name: once the
Dataset's new version is packed into it and the controller holds the new version's share on
the node, the old version is never held again. Waiting for it ends at once with exit 15 and
one line naming the store's version; the reader raises ``Superseded`` without retrying.
Before the controller reaches the node, and for a version the store still holds, the wait
goes on as for a share not held yet.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dsagent.format.bundles.bundle import pack
from dsplatform.data import AgentEndpoint
from dsplatform.errors import Superseded
from tests.dsagent.conftest import write_tree
from tools.support.harness import AgentProcess, LoopbackServer

pytestmark = pytest.mark.slow  # an agent process


def _dsctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsagent.cli", *args], capture_output=True, text=True, timeout=60)


def _hold(agent: AgentProcess, store: str) -> None:
    transport = httpx.HTTPTransport(uds=str(agent.socket))
    with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as client:
        held = client.put("/v1/stripes/imgs", json={"store": store, "members": ["node-a"], "peers": {}})
    assert held.status_code == 200, held.text


def _version(www: Path, seed: int) -> str:
    rng = random.Random(seed)
    src = www / f"src-{seed}"
    write_tree(src, {f"d{i % 3}/f{i:02d}.bin": rng.randbytes(2_000 + rng.randrange(2_000)) for i in range(24)})
    return pack(src, www / "store", name="imgs", max_files=4).digest


def test_a_superseded_version_ends_the_wait_at_once_and_the_current_one_is_still_waited_for(tmp_path: Path) -> None:
    www = tmp_path / "www"
    old = _version(www, 1)
    server = LoopbackServer(www)
    store = f"{server.url}/store"
    agent = AgentProcess(tmp_path / "node-a", env={"DSAGENT_NODE_NAME": "node-a"})
    socket = str(agent.socket)
    try:
        agent.start()
        # nothing held here yet: a share not held yet is waited for (exit 7 at the timeout)
        waited = _dsctl("stripe", "wait", "imgs", old, "--timeout", "1s", "--socket", socket)
        assert waited.returncode == 7 and "holds no share of it yet" in waited.stdout, waited
        _hold(agent, store)
        assert _dsctl("stripe", "wait", "imgs", old, "--until", "complete", "--socket", socket).returncode == 0

        new = _version(www, 2)  # the Dataset's next version replaces the store's manifest
        assert new != old
        # the controller has not reached this node yet: the new version is waited for, the
        # old one (still held here) is still served
        waited = _dsctl("stripe", "wait", "imgs", new, "--timeout", "1s", "--socket", socket)
        assert waited.returncode == 7 and "holds no share of it yet" in waited.stdout, waited
        assert _dsctl("stripe", "wait", "imgs", old, "--socket", socket).returncode == 0

        _hold(agent, store)  # the controller's next pass: the current version's share
        transport = httpx.HTTPTransport(uds=socket)
        with httpx.Client(transport=transport, base_url="http://agent", timeout=60) as client:
            client.delete("/v1/stripes/imgs", params={"digest": old})  # the old share is released
            answer = client.get(f"/v1/stripes/imgs/{old}")
        assert answer.status_code == 410 and answer.json()["code"] == "superseded", answer.text
        assert new[:12] in answer.json()["message"]

        started = time.monotonic()
        gone = _dsctl("stripe", "wait", "imgs", old, "--timeout", "60s", "--socket", socket)
        assert gone.returncode == 15, gone
        assert time.monotonic() - started < 30, "the wait ran to its timeout"
        lines = gone.stderr.strip().splitlines()
        assert len(lines) == 1 and "superseded" in lines[0] and new[:12] in lines[0], gone.stderr
        assert _dsctl("stripe", "wait", "imgs", new, "--until", "complete", "--socket", socket).returncode == 0

        # the reader's bundle request: gone for good, not a retry
        endpoint = AgentEndpoint(f"unix://{socket}")
        with pytest.raises(Superseded, match="superseded"):
            endpoint.open_bundle("imgs", old, "0" * 32)
        # a malformed digest is still refused as input, before anything is looked up
        with httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://agent") as client:
            assert client.get("/v1/stripes/imgs/not-a-digest").status_code == 400
    finally:
        agent.stop()
        server.close()
