"""Leases and the idle sweep, with the clock injected (in process, memory:// sources)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import fsspec

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.servicehooks import ServiceHooks
from dsagent.cache.settings import Settings
from tests.clock import Clock


def write_memory_dataset(root: str, files: int) -> None:
    fs = fsspec.filesystem("memory")
    for i in range(files):
        fs.pipe(f"{root.split('://', 1)[1]}/f{i}.bin", bytes([i]) * 500)


def test_a_lapsed_lease_releases_the_task_and_idle_datasets_are_swept(tmp_path: Path, memory_root: str) -> None:
    write_memory_dataset(memory_root, 3)
    clock = Clock(1_000_000.0)
    settings = Settings(root=tmp_path, lease_ttl=60, idle_ttl=3600, sweep_interval=3600)

    async def run() -> None:
        service = CacheService(settings, clock=clock)
        await service.start()
        try:
            record = await service.submit_task("pod", [DatasetRequest("mem", memory_root)], wait=30)
            assert record.state == "ready", record
            clock.now += 30
            await service.sweep()
            assert (await service.datasets())[0]["inUse"] is True  # lease still valid
            await service.submit_task("pod", [DatasetRequest("mem", memory_root)])  # renews the lease
            clock.now += 59
            await service.sweep()
            assert (await service.datasets())[0]["inUse"] is True
            clock.now += 2
            await service.sweep()
            view = (await service.datasets())[0]
            assert view["inUse"] is False  # lapsed and released, still cached
            clock.now += 3599
            await service.sweep()
            assert len(await service.datasets()) == 1  # not idle long enough yet
            clock.now += 100
            await service.sweep()
            assert await service.datasets() == []  # idle past the TTL: swept
            assert not Path(view["path"]).exists()
        finally:
            await service.stop()

    asyncio.run(run())


def test_an_unchanged_remote_listing_is_a_hit_without_reading_and_a_change_is_seen(
    tmp_path: Path, memory_root: str, monkeypatch: Any
) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    write_memory_dataset(memory_root, 4)
    opens: list[str] = []
    real_open = MemoryFileSystem._open

    def counting_open(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        opens.append(path)
        return real_open(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "_open", counting_open)
    request = DatasetRequest("mem", memory_root)

    async def run() -> None:
        service = CacheService(Settings(root=tmp_path, sweep_interval=3600))
        await service.start()
        try:
            first = await service.submit_task("t1", [request], wait=30)
            assert first.state == "ready"
            assert len(opens) == len(set(opens)) == 4  # a miss reads each file once: digested while copied
            opens.clear()
            second = await service.submit_task("t2", [request], wait=30)
            assert (second.state, second.datasets[0].digest) == ("ready", first.datasets[0].digest)
            assert opens == []  # the consistency check listed the source and read nothing
            time.sleep(0.01)
            fsspec.filesystem("memory").pipe(f"{memory_root.split('://', 1)[1]}/f0.bin", b"changed")
            third = await service.submit_task("t3", [request], wait=30)
            assert third.state == "ready" and third.datasets[0].digest != first.datasets[0].digest
        finally:
            await service.stop()

    asyncio.run(run())


def test_a_forced_eviction_shows_in_the_task_and_repeating_the_request_caches_again(
    tmp_path: Path, memory_root: str
) -> None:
    write_memory_dataset(memory_root, 2)
    request = DatasetRequest("mem", memory_root)

    async def run() -> None:
        service = CacheService(Settings(root=tmp_path, sweep_interval=3600))
        await service.start()
        try:
            assert (await service.submit_task("t", [request], wait=30)).state == "ready"
            result = await service.evict(names=["mem"], force=True)
            assert [v.name for v in result.evicted] == ["mem"]
            gone = (await service.get_task("t")).datasets[0]
            assert (gone.state, (gone.error or {}).get("code")) == ("failed", "gone")
            again = await service.submit_task("t", [request], wait=30)
            assert again.state == "ready" and again.datasets[0].path and Path(again.datasets[0].path).is_dir()
        finally:
            await service.stop()

    asyncio.run(run())


def test_twenty_concurrent_tasks_share_one_per_file_copy(tmp_path: Path, memory_root: str, monkeypatch: Any) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    write_memory_dataset(memory_root, 5)
    opens: list[str] = []
    real_open = MemoryFileSystem._open

    def slow_counting_open(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        opens.append(path)
        time.sleep(0.05)  # a slow source: the burst arrives while the copy runs
        return real_open(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "_open", slow_counting_open)

    async def run() -> None:
        service = CacheService(Settings(root=tmp_path, sweep_interval=3600, fetch_workers=2))
        await service.start()
        try:
            records = await asyncio.gather(
                *(service.submit_task(f"pod-{i}", [DatasetRequest("mem", memory_root)], wait=60) for i in range(20))
            )
            assert {r.state for r in records} == {"ready"}
            assert len({r.datasets[0].path for r in records}) == 1
        finally:
            await service.stop()

    asyncio.run(run())
    assert len(opens) == len(set(opens)) == 5


def test_the_cluster_integration_can_refuse_unknown_task_ids(tmp_path: Path, memory_root: str) -> None:
    from dsagent.errors import NotFound

    write_memory_dataset(memory_root, 1)

    async def only_pods_on_this_node(task_id: str) -> None:
        if not task_id.startswith("pod-"):
            raise NotFound(f"no pod with UID {task_id!r} on this node")

    async def run() -> None:
        hooks = ServiceHooks(admit_task=only_pods_on_this_node)
        service = CacheService(Settings(root=tmp_path, sweep_interval=3600), hooks=hooks)
        await service.start()
        try:
            try:
                await service.submit_task("stranger", [DatasetRequest("mem", memory_root)])
            except NotFound:
                pass
            else:
                raise AssertionError("an unknown task id was admitted")
            assert await service._db(service.catalog.tasks) == []
            assert (await service.submit_task("pod-1", [DatasetRequest("mem", memory_root)], wait=30)).state == "ready"
        finally:
            await service.stop()

    asyncio.run(run())


def test_the_same_task_sent_many_times_at_once_is_one_task(tmp_path: Path, memory_root: str) -> None:
    write_memory_dataset(memory_root, 2)

    async def run() -> None:
        service = CacheService(Settings(root=tmp_path, sweep_interval=3600))
        await service.start()
        try:
            records = await asyncio.gather(
                *(service.submit_task("pod", [DatasetRequest("mem", memory_root)], wait=30) for _ in range(10))
            )
            assert {r.created_at for r in records} == {records[0].created_at}
            assert len(await service._db(service.catalog.tasks)) == 1
        finally:
            await service.stop()

    asyncio.run(run())


def test_a_cached_copy_removed_behind_the_agents_back_is_fetched_again(tmp_path: Path, memory_root: str) -> None:
    import shutil

    write_memory_dataset(memory_root, 2)

    async def run() -> None:
        service = CacheService(Settings(root=tmp_path, sweep_interval=3600))
        await service.start()
        try:
            first = await service.submit_task("a", [DatasetRequest("mem", memory_root)], wait=30)
            shutil.rmtree(first.datasets[0].path or "")
            second = await service.submit_task("b", [DatasetRequest("mem", memory_root)], wait=30)
            assert second.state == "ready" and Path(second.datasets[0].path or "").is_dir()
        finally:
            await service.stop()

    asyncio.run(run())
