"""Eviction races, made deterministic: a gate pauses one catalog call of the service (before
or after it runs) so another coroutine can act in exactly that window; no sleeps, no luck."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import fsspec

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from tests.clock import Clock
from tools.support.harness import allocated


class Gate:
    """Pause the first catalog call named ``method`` (``before`` it runs or ``after``)
    until :meth:`open`; ``reached`` is set when a coroutine is held there. With
    ``pool="work"`` it pauses a call to the worker pool instead."""

    def __init__(self, service: CacheService, method: str, *, after: bool = False, pool: str = "db") -> None:
        self.reached = asyncio.Event()
        self._opened = asyncio.Event()
        self._used = False
        real: Callable[..., Awaitable[Any]] = getattr(service.pools, pool)

        async def db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            hold = getattr(fn, "__name__", "") == method and not self._used
            self._used = self._used or hold
            if hold and not after:
                await self._hold()
            result = await real(fn, *args, **kwargs)
            if hold and after:
                await self._hold()
            return result

        setattr(service.pools, pool, db)

    async def _hold(self) -> None:
        self.reached.set()
        await self._opened.wait()

    def open(self) -> None:
        self._opened.set()


def write_memory_dataset(root: str, files: int, salt: bytes) -> None:
    fs = fsspec.filesystem("memory")
    for i in range(files):
        fs.pipe(f"{root.split('://', 1)[1]}/f{i}.bin", salt + bytes([i]) * 499)


def write_local_dataset(root: Path, files: int, salt: bytes) -> Path:
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"f{i}.bin").write_bytes(salt + bytes([i]) * 499)
    return root


@asynccontextmanager
async def running(settings: Settings, clock: Clock | None = None) -> AsyncIterator[CacheService]:
    service = CacheService(settings, clock=clock or Clock(1_000_000.0))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def settled(service: CacheService, task_id: str) -> Any:
    """The task's record once its work has finished (its work is private to the service)."""
    await service._taskwork.wait(task_id, 30)
    return await service.get_task(task_id)


def test_a_version_just_copied_is_not_evicted_before_its_task_is_bound(tmp_path: Path, memory_root: str) -> None:
    # the per-file copy path makes a version ready inside the shared resolve step; the
    # task binds to it only afterwards: a fetch needing space must not take it meanwhile
    first, second = f"{memory_root}/a", f"{memory_root}/b"
    write_memory_dataset(first, 3, b"a")
    write_memory_dataset(second, 3, b"b")
    # room for one of them (1500 bytes in 3 files, on disk), not for both: 1.2 x the
    # second's bytes (and its blocks) fit only once the first is evicted
    settings = Settings(root=tmp_path, capacity_bytes=2 * allocated(1500, 3, tmp_path), sweep_interval=3600)

    async def run() -> None:
        async with running(settings) as service:
            gate = Gate(service, "bind")
            await service.submit_task("a", [DatasetRequest("a", first)])
            await gate.reached.wait()  # "a" is ready on disk, task "a" not yet bound to it
            assert [v["state"] for v in await service.datasets()] == ["ready"]
            other = await service.submit_task("b", [DatasetRequest("b", second)], wait=30)
            gate.open()
            mine = await settled(service, "a")
            assert mine.state == "ready", mine
            assert Path(mine.datasets[0].path or "").is_dir()
            assert (other.state, (other.datasets[0].error or {}).get("code")) == ("failed", "insufficient_space")

    asyncio.run(run())


def test_a_copy_is_claimed_for_its_tasks_before_it_becomes_ready(tmp_path: Path, memory_root: str) -> None:
    # the narrowest window: a fetch that was waiting for the space lock while the copy was
    # made ready gets the lock first, before the copy's shared step has even returned
    first, second = f"{memory_root}/a", f"{memory_root}/b"
    write_memory_dataset(first, 3, b"a")
    write_memory_dataset(second, 3, b"b")
    # room for one of them (1500 bytes in 3 files, on disk), not for both: 1.2 x the
    # second's bytes (and its blocks) fit only once the first is evicted
    settings = Settings(root=tmp_path, capacity_bytes=2 * allocated(1500, 3, tmp_path), sweep_interval=3600)

    async def run() -> None:
        async with running(settings) as service:
            making_ready = Gate(service, "begin_version")
            await service.submit_task("a", [DatasetRequest("a", first)])
            await making_ready.reached.wait()  # the copy of "a" holds the space lock, about to commit
            listed = Gate(service, "list_remote", after=True, pool="work")
            await service.submit_task("b", [DatasetRequest("b", second)])
            await listed.reached.wait()
            listed.open()
            for _ in range(5):  # let "b" run on until it queues for the space lock
                await asyncio.sleep(0)
            making_ready.open()
            mine, other = await settled(service, "a"), await settled(service, "b")
            assert mine.state == "ready", mine
            assert Path(mine.datasets[0].path or "").is_dir()
            assert (other.state, (other.datasets[0].error or {}).get("code")) == ("failed", "insufficient_space")

    asyncio.run(run())


def test_the_idle_sweep_never_evicts_a_dataset_a_new_task_has_just_been_given(tmp_path: Path, memory_root: str) -> None:
    write_memory_dataset(memory_root, 2, b"m")
    clock = Clock(1_000_000.0)
    settings = Settings(root=tmp_path, idle_ttl=100, sweep_interval=3600)
    request = DatasetRequest("mem", memory_root)

    async def run() -> None:
        async with running(settings, clock) as service:
            assert (await service.submit_task("old", [request], wait=30)).state == "ready"
            await service.release_task("old")
            clock.now += 200  # idle past the TTL
            gate = Gate(service, "delete_version")
            sweep = asyncio.create_task(service.sweep())
            await gate.reached.wait()  # the sweep chose the idle version and is about to delete it
            new = await service.submit_task("new", [request], wait=30)
            assert new.state == "ready"  # a hit on the cached copy
            gate.open()
            await sweep
            again = await service.get_task("new")
            assert again.state == "ready", again
            assert Path(again.datasets[0].path or "").is_dir()
            assert [v["inUse"] for v in await service.datasets()] == [True]

    asyncio.run(run())


def test_a_version_just_committed_ready_counts_once_against_the_capacity(tmp_path: Path) -> None:
    # between the ready commit and the release of the fetch's reservation, a second fetch
    # must see that space counted once, not twice (held and reserved)
    first = write_local_dataset(tmp_path / "src" / "a", 3, b"a")
    second = write_local_dataset(tmp_path / "src" / "b", 3, b"b")
    each = allocated(1500, 3, tmp_path)  # 1500 bytes in 3 files, on disk
    # both on disk plus 1000 bytes: counted once, "a" leaves 2500 bytes for 1.2 x 1500 of
    # "b" (besides its blocks); counted twice, 1000
    settings = Settings(
        root=tmp_path / "cache", capacity_bytes=2 * each + 1000, sweep_interval=3600, local_sources=(tmp_path / "src",)
    )

    async def run() -> None:
        async with running(settings) as service:
            gate = Gate(service, "mark_ready", after=True)
            await service.submit_task("a", [DatasetRequest("a", str(first))])
            await gate.reached.wait()  # "a" is committed ready; its fetch has not resumed
            other = await service.submit_task("b", [DatasetRequest("b", str(second))], wait=30)
            assert other.state == "ready", other
            gate.open()
            assert (await settled(service, "a")).state == "ready"
            assert (await service.space())["usedBytes"] == 2 * each

    asyncio.run(run())


def test_a_version_whose_bundles_a_fetch_links_from_is_not_evicted_under_it(tmp_path: Path) -> None:
    # a changed dataset hard-links its unchanged bundles from the cached older version,
    # which no task uses: another fetch needing space must not delete it mid-link
    from dsagent.format.bundles.bundle import pack

    src = tmp_path / "src"
    data, store = write_local_dataset(src / "d", 4, b"d"), src / "bundles"
    other = write_local_dataset(src / "c", 4, b"c")
    pack(data, store, name="d", max_files=1)
    # room for three versions of 2000 bytes in 4 files (on disk): version 1, version 2
    # being fetched, and 1.2 x "c" only once version 1 is evicted
    settings = Settings(
        root=tmp_path / "cache",
        capacity_bytes=3 * allocated(2000, 4, tmp_path),
        fetch_workers=1,
        sweep_interval=3600,
        local_sources=(src,),
    )
    request = DatasetRequest("d", str(data), bundles=str(store))

    async def run() -> None:
        async with running(settings) as service:
            assert (await service.submit_task("v1", [request], wait=30)).state == "ready"
            await service.release_task("v1")  # version 1 (2000 bytes) is unused now
            (data / "f3.bin").write_bytes(b"changed" * 70)
            pack(data, store, name="d", max_files=1)
            gate = Gate(service, "bundle_done")
            await service.submit_task("v2", [request])
            await gate.reached.wait()  # the first bundle was linked from version 1; three to go
            squeeze = await service.submit_task("c", [DatasetRequest("c", str(other))], wait=30)
            gate.open()
            new = await settled(service, "v2")
            assert new.state == "ready", new
            assert (squeeze.state, (squeeze.datasets[0].error or {}).get("code")) == ("failed", "insufficient_space")

    asyncio.run(run())


def test_a_failed_fetch_left_on_disk_counts_against_the_capacity(tmp_path: Path) -> None:
    # a failed fetch keeps its staging for a resume; the capacity must count it, or a new
    # fetch would fill the cache past its limit instead of evicting the failed one
    source = write_local_dataset(tmp_path / "src" / "b", 4, b"b")  # 2000 bytes
    # the failed version (1500 bytes, 1 file) and "b" on disk, less 500 bytes: "b" fits
    # (1.2 x its bytes, and its blocks) only once the failed one is evicted
    capacity = allocated(1500, 1, tmp_path) + allocated(2000, 4, tmp_path) - 500
    settings = Settings(
        root=tmp_path / "cache", capacity_bytes=capacity, sweep_interval=3600, local_sources=(tmp_path / "src",)
    )
    failed = "ab" * 16

    async def run() -> None:
        async with running(settings) as service:
            await service.pools.db(
                service.catalog.begin_version,
                "f",
                failed,
                size_bytes=1500,
                files=1,
                source="s3://x/f",
                bundles=None,
                now=1.0,
            )
            await service.pools.db(service.catalog.mark_failed, "f", failed, "source went away")
            staging = service.store.staging_dir("f", failed)
            staging.mkdir(parents=True)
            (staging / "part").write_bytes(b"x" * 1500)
            record = await service.submit_task("b", [DatasetRequest("b", str(source))], wait=30)
            assert record.state == "ready", record
            assert [v["name"] for v in await service.datasets()] == ["b"]  # the failed one made room
            assert not staging.exists()

    asyncio.run(run())
