"""A background ``syncfs`` that fails (a writeback error) must fail the fetch, or the pack
writing a bundle, never let it publish.

The kernel reports a writeback error once per open file: the background flush
(:class:`dsagent.format.durable.Writeback`) saw it on its descriptor, and the fetch's
final ``syncfs``, on a descriptor opened later, does not. Here ``syncfs`` fails with
EIO on the background flush thread only, as it would after a real write error; the rest
is real (an in-process agent, tar+zstd bundles in a local store). A dropped flush error
would let the dataset become ready.
"""

from __future__ import annotations

import asyncio
import errno
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.errors import DsagentError, IntegrityError
from dsagent.format import durable
from dsagent.format.bundles.bundle import pack, unpack, verify_tree
from dsagent.format.manifest import read_manifest
from tests.dsagent.conftest import write_tree

pytestmark = pytest.mark.usefixtures("native_mode")  # each test with the native loops and the pure ones


class _FailingBackgroundFlush:
    """A ``syncfs`` that fails with EIO on the background writeback thread while ``failing``."""

    def __init__(self, real: Callable[[int], int]) -> None:
        self.real = real
        self.failing = True
        self.failed = 0

    def syncfs(self, fd: int) -> int:
        if self.failing and threading.current_thread().name == "dsagent-writeback":
            self.failed += 1
            return errno.EIO
        return self.real(fd)


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> _FailingBackgroundFlush:
    real = durable._syncfs_call()
    assert real is not None
    fake = _FailingBackgroundFlush(real)
    monkeypatch.setattr(durable, "_syncfs_call", lambda: fake.syncfs)
    monkeypatch.setattr(durable, "WRITEBACK_STEP", 4096)  # a background flush every 4 kB written
    return fake


def _dataset(tmp_path: Path, libc: _FailingBackgroundFlush) -> tuple[Path, Path]:
    files = {f"class{i % 3}/img{i:03d}.bin": bytes([i]) * 9000 for i in range(24)}
    source = write_tree(tmp_path / "src" / "images", files)
    store = tmp_path / "src" / "store"
    libc.failing = False  # the pack's own background flushes succeed; the failure is the reader's
    pack(source, store, name="images", max_files=4)
    libc.failing = True
    return source, store


def test_a_failed_background_flush_fails_the_fetch_and_the_retry_publishes_a_whole_copy(
    tmp_path: Path, libc: _FailingBackgroundFlush
) -> None:
    source, store = _dataset(tmp_path, libc)
    manifest = read_manifest(str(store), "images")
    request = DatasetRequest("images", str(source), str(store))

    async def run() -> None:
        settings = Settings(root=tmp_path / "cache", sweep_interval=3600, local_sources=(tmp_path / "src",))
        service = CacheService(settings)
        await service.start()
        try:
            record = await service.submit_task("t", [request], wait=60)
            assert libc.failed >= 1  # the flush did fail
            assert record.state == "failed", record
            assert (record.datasets[0].error or {}).get("code") == "integrity", record
            assert not any((tmp_path / "cache" / "datasets").rglob("*")), "a copy was published"
            assert not any((tmp_path / "cache" / "staging").iterdir()), "its staging was kept"
            libc.failing = False  # the disk is healthy again: the same request succeeds
            again = await service.submit_task("t", [request], wait=60)
            assert again.state == "ready", again
            verify_tree(str(again.datasets[0].path), manifest)
        finally:
            await service.stop()

    asyncio.run(run())


def test_dsctl_unpack_fails_on_a_failed_background_flush(tmp_path: Path, libc: _FailingBackgroundFlush) -> None:
    _, store = _dataset(tmp_path, libc)
    with pytest.raises(IntegrityError, match="flushing"):
        unpack(store=store, name="images", dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_pack_fails_on_a_failed_background_flush_of_its_bundle_and_publishes_nothing(
    tmp_path: Path, libc: _FailingBackgroundFlush
) -> None:
    files = {f"d/f{i}.bin": random.Random(i).randbytes(9000) for i in range(12)}  # stored raw: 108 kB
    source = write_tree(tmp_path / "src", files)
    store = tmp_path / "store"
    with pytest.raises(DsagentError, match="background flush"):
        pack(source, store, name="images")
    assert libc.failed >= 1
    assert not [p for p in store.rglob("*") if p.is_file()], "a bundle, a manifest or a temporary was kept"
    libc.failing = False  # the disk is healthy again: the same pack publishes
    pack(source, store, name="images")
    verify_tree(str(source), read_manifest(str(store), "images"))
