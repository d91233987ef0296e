"""A share handed over to a new owner comes from the old owner even when it is busy.

Two real agents on loopback TCP and a bundle store over HTTP. ``node-a`` holds the whole
version alone and serves one bundle at a time to a peer (``peer_max_uploads_per_peer=1``);
the group then becomes ``node-b`` alone (``node-a`` listed as a peer, as the controller
lists a draining node), and ``node-b`` fetches with eight workers, so most of its asks are
answered 429. A busy owner holds the bundle: ``node-b`` asks again rather than reading the
store.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dsagent.format.bundles.bundle import pack
from tests.dsagent.conftest import write_tree
from tests.dsagent.stripeadmin import hold, until_complete
from tools.support.harness import AgentProcess, LoopbackServer

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.slow  # two agent processes

TOKEN = "peer-token-0123456789abcdef"


def test_a_busy_previous_owner_is_asked_again_not_the_store(tmp_path: Path) -> None:
    rng = random.Random(3)
    files = {f"d{i % 5}/f{i:03d}.bin": rng.randbytes(20_000 + rng.randrange(20_000)) for i in range(96)}
    write_tree(tmp_path / "www" / "src", files)
    manifest = pack(tmp_path / "www" / "src", tmp_path / "www" / "store", name="imgs", max_files=2)
    server = LoopbackServer(tmp_path / "www")
    store = f"{server.url}/store"
    env = {"DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_FETCH_WORKERS": "8"}
    old = AgentProcess(
        tmp_path / "node-a",
        tcp=True,
        env={**env, "DSAGENT_NODE_NAME": "node-a", "DSAGENT_PEER_MAX_UPLOADS_PER_PEER": "1"},
    )
    new = AgentProcess(tmp_path / "node-b", tcp=True, env={**env, "DSAGENT_NODE_NAME": "node-b"})
    try:
        old.start(), new.start()
        peers = {"node-a": old.url, "node-b": new.url}
        hold(old, "imgs", store, ["node-a"], peers)
        assert until_complete(old, "imgs", manifest.digest)["bundlesHeld"] == len(manifest.bundles)
        from_store = sum(server.gets(lambda p: "/store/bundles/" in p).values())
        assert from_store == len(manifest.bundles)

        hold(new, "imgs", store, ["node-b"], peers)  # node-a drains: a peer, no longer a member
        status = until_complete(new, "imgs", manifest.digest)
        assert status["error"] is None and status["bundlesHeld"] == len(manifest.bundles)
        assert sum(server.gets(lambda p: "/store/bundles/" in p).values()) == from_store  # none from the store
        share = new.root / "stripes" / "imgs" / manifest.digest / "share"
        assert {p.relative_to(share).as_posix(): p.read_bytes() for p in share.rglob("*.bin")} == files
        with old.client() as client:
            text = client.metrics()
        busy = [
            line
            for line in text.splitlines()
            if line.startswith("dsplatform_agent_http_request_duration_seconds_count")
            and "/v1/peer/bundles/" in line
            and 'status="429"' in line
        ]
        assert busy, "the old owner never answered 429: the test did not load it"
    finally:
        new.stop(), old.stop()
        server.close()
