"""The cache's capacity counts disk use, not logical bytes: a dataset of many small files
takes a block and an inode per file, so 200 files of 100 bytes need ~1.6 MB of disk
(4 KiB blocks), not 20 kB. A capacity that holds their bytes three times does not hold
them; one of 1.3 x their disk use does, and ``usedBytes`` reports that disk use.

Counting ``size_bytes`` on the capacity side would accept the first fetch and report
``usedBytes`` 20,000.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import fsspec
import pytest

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from tools.support.harness import allocated

FILES, SIZE = 200, 100
LOGICAL = FILES * SIZE


def small_files(source: str, tmp_path: Path, memory_root: str) -> str:
    """200 files of 100 bytes: a local directory (digested, then fetched), or a
    ``memory://`` tree (copied file by file under a pending reservation)."""
    if source == "local":
        root = tmp_path / "src" / "tiny"
        root.mkdir(parents=True)
        for i in range(FILES):
            (root / f"f{i:03d}.bin").write_bytes(i.to_bytes(2, "big") * (SIZE // 2))
        return str(root)
    fs = fsspec.filesystem("memory")
    for i in range(FILES):
        fs.pipe(f"{memory_root.split('://', 1)[1]}/f{i:03d}.bin", i.to_bytes(2, "big") * (SIZE // 2))
    return memory_root


@pytest.mark.parametrize("source", ["local", "memory"])
def test_the_capacity_counts_blocks_and_inodes_not_logical_bytes(tmp_path: Path, memory_root: str, source: str) -> None:
    url = small_files(source, tmp_path, memory_root)
    on_disk = allocated(LOGICAL, FILES, tmp_path)
    assert on_disk > 3 * LOGICAL  # the point: their bytes fit three times, their disk use does not

    async def cache(capacity: int, root: Path) -> tuple[str, str | None, dict[str, int]]:
        settings = Settings(root=root, capacity_bytes=capacity, sweep_interval=3600, local_sources=(tmp_path / "src",))
        service = CacheService(settings)
        await service.start()
        try:
            record = await service.submit_task("t", [DatasetRequest("tiny", url)], wait=30)
            return record.state, (record.datasets[0].error or {}).get("code"), await service.space()
        finally:
            await service.stop()

    state, code, space = asyncio.run(cache(3 * LOGICAL, tmp_path / "small"))
    assert (state, code) == ("failed", "insufficient_space")
    assert space["usedBytes"] == 0

    capacity = int(1.3 * on_disk)
    state, code, space = asyncio.run(cache(capacity, tmp_path / "big"))
    assert (state, code) == ("ready", None)
    assert space["usedBytes"] == on_disk
    assert space["freeBytes"] == capacity - on_disk  # counted once, as held
