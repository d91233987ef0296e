"""What a node's readers read of a striped version, on the agent's metrics: the bytes of the
bundles it opened from its own share, and of those fetched through its window (in process,
a real bundle store over loopback HTTP). Their ratio is the local reads an operator can see
on a node, the figure the cluster simulator's claims are about."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

from dsagent.cache.service import CacheService
from dsagent.cache.servicehooks import ServiceHooks
from dsagent.cache.settings import Settings
from dsagent.format.bundles.bundle import pack
from dsagent.format.manifest import Manifest
from dsplatform.stripe import owner
from tests.clock import Clock
from tests.dsagent.conftest import write_tree
from tools.support.harness import LOOPBACK

NODE = "node-a"


def _store(www: Path) -> Manifest:
    files = {f"imgs/f{i:03d}.bin": os.urandom(3000 + 97 * i) for i in range(24)}
    write_tree(www / "src", files)
    return pack(www / "src", www / "imgs", name="imgs", max_files=4)


def _partner(manifest: Manifest) -> str:
    """A second member with which this node owns some of the version's bundles, not all."""
    digests = [b.digest for b in manifest.bundles]
    for other in (f"node-{c}" for c in "bcdefghijk"):
        mine = sum(owner(d, [NODE, other]) == NODE for d in digests)
        if 0 < mine < len(digests):
            return other
    raise AssertionError("no partner splits the bundles")


def _read_bytes(service: CacheService) -> dict[str, int]:
    text = service.metrics.render()
    found = re.findall(r'^dsplatform_agent_stripe_reader_bytes_total\{source="(\w+)"\} (\S+)$', text, re.M)
    return {source: int(float(value)) for source, value in found}


def test_readers_bytes_from_the_share_and_through_the_window_are_counted_apart(
    tmp_path: Path, loopback: tuple[Path, str, Any]
) -> None:
    www, url, _ = loopback
    manifest = _store(www)
    partner = _partner(manifest)
    settings = Settings(root=tmp_path / "cache", node_name=NODE, egress_allow=LOOPBACK, sweep_interval=3600)

    async def run() -> None:
        service = CacheService(settings, clock=Clock(1_000_000.0), hooks=ServiceHooks())
        await service.start()
        try:
            assert _read_bytes(service) == {"share": 0, "window": 0}, "both series before the first read"
            status = await service.stripes.hold("imgs", f"{url}/imgs", [NODE, partner], {}, holders=[("ml", "imgs")])
            key = ("imgs", str(status["digest"]))
            for _ in range(600):
                if service.stripes.status(key)["complete"]:
                    break
                await asyncio.sleep(0.05)
            expected = {"share": 0, "window": 0}
            for bundle in manifest.bundles:
                _, _, stream = await service.stripes.open_bundle("imgs", key[1], bundle.digest)
                stream.close()
                expected["share" if owner(bundle.digest, [NODE, partner]) == NODE else "window"] += bundle.size
            assert expected["share"] and expected["window"]
            assert _read_bytes(service) == expected
        finally:
            await service.stop()

    asyncio.run(run())
