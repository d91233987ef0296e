"""A catalog whose SQLite header is damaged does not stop the agent.

A real in-process agent caches two versions from a real tar+zstd bundle store and stops;
the catalog's header is overwritten (as a torn write or a bad sector would leave it) and
one file of one cached version is changed. The agent starts again: it keeps the damaged
file aside, rebuilds its records from the cache directory, keeping the version that
verifies against its stored manifest (a hit, nothing read from the store) and discarding
the other (fetched again), and says so in a log line and a metric.

"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.format.bundles.bundle import pack, verify_tree
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import write_tree


def _packed(base: Path, name: str, seed: int) -> DatasetRequest:
    files = {f"part{i}/f{i:02d}.bin": bytes([seed, i]) * 2000 for i in range(8)}
    source = write_tree(base / name, files)
    pack(source, base / "store", name=name, max_files=3)
    return DatasetRequest(name, str(source), str(base / "store"))


@pytest.mark.parametrize("where", ["header", "page"])
def test_a_damaged_catalog_is_kept_aside_and_rebuilt_from_verified_copies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    data = tmp_path / "data"
    good, bad = _packed(data, "good", 1), _packed(data, "bad", 2)
    root = tmp_path / "cache"
    settings = Settings(root=root, sweep_interval=3600, local_sources=(data,))

    async def first() -> dict[str, str]:
        service = CacheService(settings)
        await service.start()
        try:
            record = await service.submit_task("t", [good, bad], wait=60)
            assert record.state == "ready", record
            return {d.name: str(d.path) for d in record.datasets}
        finally:
            await service.stop()

    paths = asyncio.run(first())
    with open(root / "catalog.db", "r+b") as db:
        if where == "page":  # a torn b-tree page past the header: found by quick_check at start
            db.seek(2 * 4096 + 8)
        db.write(b"\xde\xad\xbe\xef" * 8)  # else the header ("SQLite format 3\0" and on)
    tampered = next(p for p in sorted(Path(paths["bad"]).rglob("*.bin")))
    tampered.chmod(0o644)
    tampered.write_bytes(b"x" * tampered.stat().st_size)

    async def second() -> tuple[str, str, str]:
        service = CacheService(settings)
        with caplog.at_level(logging.WARNING, logger="dsagent"):
            await service.start()  # no CatalogError: the agent starts
        try:
            hits_before = service.metrics.hits._value.get()
            record = await service.submit_task("t2", [good], wait=60)
            assert record.state == "ready", record
            assert service.metrics.hits._value.get() == hits_before + 1  # kept, verified: a hit
            again = await service.submit_task("t3", [bad], wait=60)
            assert again.state == "ready", again  # discarded, then fetched again
            verify_tree(str(again.datasets[0].path), read_manifest(str(data / "store"), "bad"))
            return str(record.datasets[0].path), await service.metrics_text(), caplog.text
        finally:
            await service.stop()

    path, metrics, logged = asyncio.run(second())
    assert path == paths["good"]
    verify_tree(path, read_manifest(str(data / "store"), "good"))
    assert [p.name for p in root.glob("catalog.db.damaged-*")], "the damaged catalog was not kept"
    assert "dsplatform_agent_catalog_rebuilds_total 1.0" in metrics
    assert 'dsplatform_agent_catalog_rebuild_versions_total{result="kept"} 1.0' in metrics
    assert 'dsplatform_agent_catalog_rebuild_versions_total{result="discarded"} 1.0' in metrics
    assert "catalog was damaged" in logged and "1 ready versions verified and kept, 1 discarded" in logged
