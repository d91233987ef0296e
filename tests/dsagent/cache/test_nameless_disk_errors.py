"""A cache-disk error that names no file (``os.fsync`` of a descriptor raises ENOSPC without
one, as the kernel reports it) is the node's disk, never the source: a dataset it fails says
``insufficient_space``, not the transient ``source_unavailable`` a retry would chase."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from tests.dsagent.conftest import write_tree


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_without_a_file_name_fails_as_the_cache_disks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    source = write_tree(tmp_path / "data" / "coco", {f"{i}.jpg": os.urandom(2000) for i in range(8)})
    real_fsync = os.fsync
    fired: list[int] = []

    def full(fd: Any) -> None:  # the kernel's answer to fsync(2) on a full disk: no file name
        if not fired:
            fired.append(fd)
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    async def go() -> None:
        settings = Settings(root=tmp_path / "cache", sweep_interval=3600, local_sources=(tmp_path / "data",))
        service = CacheService(settings)
        await service.start()
        try:
            monkeypatch.setattr(os, "fsync", full)
            record = await service.submit_task("pod-a", [DatasetRequest("coco", str(source))], wait=60)
            monkeypatch.setattr(os, "fsync", real_fsync)
            assert fired, "no fsync was reached"
            assert record.state == "failed"
            assert (record.datasets[0].error or {}).get("code") == "insufficient_space", record.datasets[0].error
            # the disk has room again: the same request is ready
            assert (await service.submit_task("pod-a", [DatasetRequest("coco", str(source))], wait=60)).state == "ready"
        finally:
            await service.stop()

    asyncio.run(go())
