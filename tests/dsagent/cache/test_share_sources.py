"""A whole copy takes the bundles a stripe group's member holds from that member, not the store.

Two real agents on loopback TCP and a bundle store over HTTP. ``node-a`` holds a share of
the version (its inventory lists it under ``stripes``); ``node-b`` then caches the same
version whole with ``node-a`` as its peer. Each bundle ``node-a`` holds comes from it; the
others (owned by a member that is not there) come from the store, once each.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from dsagent.format.bundle import pack
from dsplatform.stripe import LAYOUT_FILE, StripeLayout
from tests.dsagent.conftest import write_tree
from tests.dsagent.harness import AgentProcess, LoopbackServer, wait_ready

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


def test_a_whole_copy_reads_a_members_bundles_from_it_and_only_the_rest_from_the_store(tmp_path: Path) -> None:
    rng = random.Random(5)
    files = {f"d{i % 4}/f{i:03d}.bin": rng.randbytes(8_000 + rng.randrange(8_000)) for i in range(48)}
    write_tree(tmp_path / "www" / "src", files)
    manifest = pack(tmp_path / "www" / "src", tmp_path / "www" / "store", name="imgs", max_files=3)
    server = LoopbackServer(tmp_path / "www")
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
