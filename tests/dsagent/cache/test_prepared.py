"""The next task prepared on the node (docs/design.md#next-job-preparation): phase 1 reads
the manifests and reserves space up to the first threshold without fetching and without
evicting what a running task uses; phase 2 fetches once the second threshold allows; the
task's own request is checked on disk before it is ready, then takes the preparation over."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from dsagent.cache.prepared import prepare_task_id
from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.errors import InvalidInput, NotFound
from dsagent.format.bundles.bundle import pack
from dsagent.policy.preparation import first_budget, second_gate, start_gate
from tests.clock import Clock
from tests.dsagent.conftest import write_tree


def packed(base: Path, name: str, seed: int, files: int = 8) -> DatasetRequest:
    tree = {f"part{i}/f{i:02d}.bin": bytes([seed, i]) * 20_000 for i in range(files)}
    source = write_tree(base / name, tree)
    pack(source, base / "store", name=name, max_files=3)
    return DatasetRequest(name, str(source), str(base / "store"))


@asynccontextmanager
async def running(
    tmp_path: Path, capacity: int | None = None, clock: Clock | None = None
) -> AsyncIterator[CacheService]:
    settings = Settings(
        root=tmp_path / "cache", sweep_interval=3600, local_sources=(tmp_path / "data",), capacity_bytes=capacity
    )
    service = CacheService(settings, clock=clock or Clock(1_000_000.0))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def disk_size(tmp_path: Path, request: DatasetRequest) -> int:
    """What a copy of ``request`` takes on disk, from a probe agent whose cache is then removed."""
    async with running(tmp_path) as probe:
        one = await size_of(probe, request)
    shutil.rmtree(tmp_path / "cache")
    return one


async def size_of(service: CacheService, request: DatasetRequest) -> int:
    record = await service.submit_task("probe", [request], wait=60)
    assert record.state == "ready"
    rows = {(r.name, r.digest): r for r in await service._db(service.catalog.versions)}
    d = record.datasets[0]
    row = rows[(d.name, d.digest or "")]
    await service.release_task("probe")
    await service.evict(names=[request.name])
    return service.store.allocated(row.size_bytes, row.files)


def test_the_thresholds_as_pure_rules() -> None:
    assert first_budget(1000, 0.3, 0) == 300
    assert first_budget(1000, 0.3, 250) == 50
    assert first_budget(1000, 0.3, 300) == 0 and first_budget(1000, 0.3, 400) == 0
    assert second_gate(1000, 0.9, 500, 0, 400)
    assert not second_gate(1000, 0.9, 500, 100, 400)
    # the start rule: what runs plus the task's own, other preparations aside
    assert start_gate(1000, 0.9, 500, 400) and not start_gate(1000, 0.9, 501, 400)


def test_phase_1_reads_the_manifest_and_reserves_without_fetching(tmp_path: Path) -> None:
    nxt = packed(tmp_path / "data", "next", 1)

    async def go() -> None:
        async with running(tmp_path, capacity=50_000_000) as service:  # free space: the capacity's side
            free = (await service.space())["freeBytes"]
            view = await service.prepare("pod-b", [nxt], first=1.0, second=0.9)
            assert view["phase"] == 1 and view["state"] == "reserved"
            (ds,) = view["datasets"]
            assert ds["name"] == "next" and len(ds["digest"]) > 10 and not ds["held"]
            assert view["reservedBytes"] == ds["sizeBytes"] > 8 * 40_000
            assert await service.datasets() == []  # nothing fetched
            assert (await service.space())["freeBytes"] == free - view["reservedBytes"]
            again = await service.prepare("pod-b", [nxt], first=1.0, second=0.9)  # idempotent
            assert again["reservedBytes"] == view["reservedBytes"]
            await service.release_preparation("pod-b")
            assert (await service.space())["freeBytes"] == free  # given back
            with pytest.raises(NotFound):
                await service.preparations.view("pod-b")

    asyncio.run(go())


def test_a_preparation_needs_a_packed_dataset(tmp_path: Path) -> None:
    data = tmp_path / "data"
    source = write_tree(data / "raw", {"a.bin": b"x" * 100})

    async def go() -> None:
        async with running(tmp_path) as service:
            with pytest.raises(InvalidInput, match="only packed datasets"):
                await service.prepare("pod-b", [DatasetRequest("raw", str(source))], first=0.3, second=0.9)

    asyncio.run(go())


def test_the_reservation_evicts_unused_data_never_the_running_tasks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    current, old, nxt = packed(data, "current", 1), packed(data, "old", 2), packed(data, "next", 3)

    async def go() -> None:
        one = await disk_size(tmp_path, current)
        # room for two copies and a bit: the running task's, an unused one; the next one needs room
        async with running(tmp_path, capacity=int(2.5 * one)) as service:
            assert (await service.submit_task("old-task", [old], wait=60)).state == "ready"
            await service.release_task("old-task")  # unused now: an eviction candidate
            assert (await service.submit_task("pod-a", [current], wait=60)).state == "ready"
            view = await service.prepare("pod-b", [nxt], first=1.0, second=1.0)
            assert view["state"] == "reserved" and view["reservedBytes"] == one
            names = {d["name"] for d in await service.datasets()}
            assert names == {"current"}  # the unused copy went, the running task's stayed
            # no room left without the running task's data: the next one waits, evicting nothing
            another = packed(data, "another", 4)
            waiting = await service.prepare("pod-c", [another], first=1.0, second=1.0)
            assert waiting["state"] == "waiting" and "no space" in waiting["waiting"]
            assert {d["name"] for d in await service.datasets()} == {"current"}

    asyncio.run(go())


def test_the_first_threshold_stops_new_reservations_once_reached(tmp_path: Path) -> None:
    data = tmp_path / "data"
    a, b, c = packed(data, "a", 1), packed(data, "b", 2), packed(data, "c", 3)

    async def go() -> None:
        one = await disk_size(tmp_path, a)
        capacity = 10 * one
        async with running(tmp_path, capacity=capacity) as service:
            first = 0.15  # 1.5 copies: the first whole, the second what is left below it
            pa = await service.prepare("pod-a", [a], first=first, second=0.9)
            pb = await service.prepare("pod-b", [b], first=first, second=0.9)
            pc = await service.prepare("pod-c", [c], first=first, second=0.9)
            assert pa["reservedBytes"] == one
            assert pb["reservedBytes"] == int(first * capacity) - one  # up to the threshold
            assert pc["state"] == "waiting" and "first threshold" in pc["waiting"] and pc["reservedBytes"] == 0
            await service.release_preparation("pod-a")  # cleanup brings it under: it resumes
            pc = await service.prepare("pod-c", [c], first=first, second=0.9)
            assert pc["state"] == "reserved" and pc["reservedBytes"] > 0

    asyncio.run(go())


def test_a_preparation_fetching_its_data_no_longer_counts_against_the_first_threshold(tmp_path: Path) -> None:
    # the design stops new set-ups while those in set-up (phase 1) reach the first threshold;
    # one moved to its bulk fetch (phase 2) counts against the second: the controller plans
    # the same way (dsagent.policy.preparation.first_budget)
    data = tmp_path / "data"
    a, c = packed(data, "a", 1), packed(data, "c", 3)

    async def go() -> None:
        one = await disk_size(tmp_path, a)
        capacity = 10 * one
        async with running(tmp_path, capacity=capacity) as service:
            first = 0.1  # one copy
            pa = await service.prepare("pod-a", [a], first=first, second=0.9)
            assert pa["reservedBytes"] == one
            pc = await service.prepare("pod-c", [c], first=first, second=0.9)
            assert pc["state"] == "waiting" and "first threshold" in pc["waiting"]
            pa = await service.prepare("pod-a", [a], first=first, second=0.9, phase=2)  # its bulk fetch starts
            assert pa["phase"] == 2
            pc = await service.prepare("pod-c", [c], first=first, second=0.9)
            assert pc["state"] == "reserved" and pc["reservedBytes"] == one

    asyncio.run(go())


def test_phase_2_waits_for_the_running_tasks_data_above_the_second_threshold(tmp_path: Path) -> None:
    data = tmp_path / "data"
    current, nxt = packed(data, "current", 1), packed(data, "next", 2)

    async def go() -> None:
        one = await disk_size(tmp_path, current)
        async with running(tmp_path, capacity=4 * one) as service:
            assert (await service.submit_task("pod-a", [current], wait=60)).state == "ready"
            # in use 1 + next 1 copies > 0.4 x 4: marked, waits for the running task
            view = await service.prepare("pod-b", [nxt], phase=2, first=1.0, second=0.4)
            assert view["phase"] == 1 and view["state"] == "waiting" and "second threshold" in view["waiting"]
            assert {d["name"] for d in await service.datasets()} == {"current"}
            await service.release_task("pod-a")  # the current task ended
            await service.sweep()  # rechecked: the fetch starts
            view = await service.preparations.view("pod-b")
            assert view["phase"] == 2 and view["state"] in ("fetching", "prepared")
            await service._taskwork.wait(prepare_task_id("pod-b"), 60)
            view = await service.prepare("pod-b", [nxt], phase=2, first=1.0, second=0.4)  # the renewal
            assert view["state"] == "prepared" and view["reservedBytes"] == 0
            assert {d["name"]: d["state"] for d in await service.datasets()}["next"] == "ready"

    asyncio.run(go())


def test_the_task_arriving_is_checked_on_disk_then_takes_the_preparation_over(tmp_path: Path) -> None:
    nxt = packed(tmp_path / "data", "next", 1)

    async def go() -> None:
        async with running(tmp_path) as service:
            await service.prepare("pod-b", [nxt], phase=2, first=1.0, second=1.0)
            await service._taskwork.wait(prepare_task_id("pod-b"), 60)
            assert (await service.get_task(prepare_task_id("pod-b"))).state == "ready"
            # the prepared copy is damaged while it waits: a file gone
            path = Path((await service.get_task(prepare_task_id("pod-b"))).datasets[0].path or "")
            victim = sorted(p for p in path.rglob("*.bin"))[0]
            victim.chmod(0o644)
            victim.unlink()
            record = await service.submit_task("pod-b", [nxt], wait=60)
            assert record.state == "ready"
            assert sorted(p.name for p in Path(record.datasets[0].path or "").rglob("*.bin")) == [
                f"f{i:02d}.bin" for i in range(8)
            ]
            for _ in range(100):  # the hand-over follows the task's own work
                if service.preparations.get("pod-b") is None:
                    break
                await asyncio.sleep(0.02)
            assert service.preparations.get("pod-b") is None
            with pytest.raises(NotFound):
                await service.get_task(prepare_task_id("pod-b"))

    asyncio.run(go())


def test_a_preparation_not_renewed_lapses(tmp_path: Path) -> None:
    nxt = packed(tmp_path / "data", "next", 1)
    clock = Clock(1_000_000.0)

    async def go() -> None:
        async with running(tmp_path, capacity=50_000_000, clock=clock) as service:
            free = (await service.space())["freeBytes"]
            await service.prepare("pod-b", [nxt], first=1.0, second=1.0)
            assert (await service.space())["freeBytes"] < free
            clock.now += service.settings.lease_ttl + 1
            await service.sweep()
            assert await service.preparations.views() == []
            assert (await service.space())["freeBytes"] == free

    asyncio.run(go())


def test_the_task_is_not_ready_while_its_prepared_copy_is_checked(tmp_path: Path) -> None:
    from tests.dsagent.cache.test_service_races import Gate

    nxt = packed(tmp_path / "data", "next", 1)

    async def go() -> None:
        async with running(tmp_path) as service:
            await service.prepare("pod-b", [nxt], phase=2, first=1.0, second=1.0)
            await service._taskwork.wait(prepare_task_id("pod-b"), 60)
            gate = Gate(service, "check_complete", pool="work")  # hold the start check
            asked = asyncio.create_task(service.submit_task("pod-b", [nxt], wait=60))
            await asyncio.wait_for(gate.reached.wait(), 30)
            held = await service.get_task("pod-b")
            assert held.state == "pending" and held.datasets[0].state == "checking"
            gate.open()
            assert (await asked).state == "ready"

    asyncio.run(go())


def test_a_store_without_the_dataset_fails_the_preparation_and_reserves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    source = write_tree(data / "raw", {"a.bin": b"x" * 100})
    (data / "empty-store").mkdir()
    request = DatasetRequest("raw", str(source), str(data / "empty-store"))

    async def go() -> None:
        async with running(tmp_path, capacity=50_000_000) as service:
            free = (await service.space())["freeBytes"]
            view = await service.prepare("pod-b", [request], first=1.0, second=1.0)
            assert view["state"] == "failed" and view["error"]["code"] == "not_found"
            assert view["reservedBytes"] == 0 and (await service.space())["freeBytes"] == free

    asyncio.run(go())


def test_prepared_data_counts_once_against_the_second_threshold(tmp_path: Path) -> None:
    data = tmp_path / "data"
    a, b = packed(data, "a", 1), packed(data, "b", 2)

    async def go() -> None:
        one = await disk_size(tmp_path, a)
        async with running(tmp_path, capacity=4 * one) as service:
            first = await service.prepare("pod-a", [a], phase=2, first=1.0, second=0.4)
            assert first["phase"] == 2
            await service._taskwork.wait(prepare_task_id("pod-a"), 60)
            # a's copy (prepared, in use by its prepare task) counts once: 1 + 1 > 0.4 x 4
            second = await service.prepare("pod-b", [b], phase=2, first=1.0, second=0.4)
            assert second["phase"] == 1 and "prepared " + str(one) in second["waiting"]
            await service.release_preparation("pod-a")
            await service.sweep()
            assert (await service.preparations.view("pod-b"))["phase"] == 2

    asyncio.run(go())


def test_the_start_rule_holds_a_prepared_task_while_the_running_data_plus_its_own_exceed_the_second_threshold(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    current, nxt = packed(data, "current", 1), packed(data, "next", 2)

    async def go() -> None:
        one = await disk_size(tmp_path, current)
        async with running(tmp_path, capacity=4 * one) as service:
            # prepared while nothing runs: the bulk fetch is within 0.4 x 4 copies
            await service.prepare("pod-b", [nxt], phase=2, first=1.0, second=0.4)
            await service._taskwork.wait(prepare_task_id("pod-b"), 60)
            # then a job starts on the node's other GPUs with one copy's worth of data
            assert (await service.submit_task("pod-a", [current], wait=60)).state == "ready"
            # the prepared pod arrives: running 1 + its own 1 > 0.4 x 4: held, still checking
            asked = asyncio.create_task(service.submit_task("pod-b", [nxt], wait=60))
            for _ in range(200):
                view = await service.preparations.view("pod-b")
                if view["waiting"]:
                    break
                await asyncio.sleep(0.02)
            assert view["waiting"].startswith("start rule") and "held until" in view["waiting"]
            held = await service.get_task("pod-b")
            assert held.state == "pending" and held.datasets[0].state == "checking"
            assert not asked.done()
            await service.release_task("pod-a")  # the running job ended: its data released
            assert (await asyncio.wait_for(asked, 30)).state == "ready"

    asyncio.run(go())


def test_the_start_rule_counts_neither_the_tasks_own_other_data_nor_a_version_both_use_twice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shared, nxt, own = packed(data, "shared", 1), packed(data, "next", 2), packed(data, "own", 3)

    async def go() -> None:
        one = await disk_size(tmp_path, shared)
        async with running(tmp_path, capacity=4 * one) as service:
            await service.prepare("pod-b", [shared, nxt], phase=2, first=1.0, second=0.6)
            await service._taskwork.wait(prepare_task_id("pod-b"), 60)
            # a running job uses the shared version: it counts once, as the prepared task's own
            assert (await service.submit_task("pod-a", [shared], wait=60)).state == "ready"
            # the prepared pod also asks a dataset it was not prepared for: its own, not running
            record = await service.submit_task("pod-b", [shared, nxt, own], wait=60)
            assert record.state == "ready"
            assert (await service.preparations.start_hold("pod-b")) is None or service.preparations.get("pod-b") is None

    asyncio.run(go())
