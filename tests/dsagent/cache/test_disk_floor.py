"""The default capacity keeps the cache out of the kubelet's node-pressure eviction zone
(in process, on the real disk of the test machine)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import fsspec

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings


def test_cluster_mode_keeps_reserve_plus_the_kubelet_threshold_free(tmp_path: Path) -> None:
    settings = Settings(root=tmp_path / "c", kubernetes=True)
    assert (settings.reserve, settings.nodefs_available) == (None, 0.10)

    async def run() -> dict[str, int]:
        service = CacheService(settings)
        await service.start()
        try:
            return await service.space()
        finally:
            await service.stop()

    space = asyncio.run(run())
    disk = shutil.disk_usage(tmp_path)
    floor = int(0.15 * disk.total) + int(0.10 * disk.total)
    assert space["capacityBytes"] == disk.total - floor
    assert abs(space["freeBytes"] - max(0, disk.free - floor)) < 64 << 20  # other tenants write meanwhile


def test_a_fetch_that_would_cross_the_floor_fails_with_the_numbers_and_standalone_has_no_floor(
    tmp_path: Path, memory_root: str
) -> None:
    fsspec.filesystem("memory").pipe(memory_root.split("://", 1)[1] + "/a.bin", b"x" * 4096)
    used = shutil.disk_usage(tmp_path)
    reserve = f"{max(1, min(99, int(100 * used.free / used.total) + 1))}%"  # more than is free: nothing fits

    async def run(settings: Settings) -> tuple[str, dict[str, object] | None]:
        service = CacheService(settings)
        await service.start()
        try:
            record = await service.submit_task("t", [DatasetRequest("a", memory_root)], wait=30)
            return record.state, record.datasets[0].error
        finally:
            await service.stop()

    state, error = asyncio.run(run(Settings(root=tmp_path / "full", reserve=reserve, nodefs_available="0")))
    assert state == "failed" and error is not None and error["code"] == "insufficient_space", error
    state, _ = asyncio.run(run(Settings(root=tmp_path / "standalone")))
    assert state == "ready"
