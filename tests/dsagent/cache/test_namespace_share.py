"""A namespace's share of the node's cache holds when its pins arrive at once
(docs/operator-guide/tenancy.md).

A real :class:`CacheService` with a 10 MB capacity and a 10% namespace share (1 MB) is
asked for ten warm-up tasks of one namespace together (``asyncio.gather``), each a 200 kB
dataset: five fit. Whether the size is declared by a bundle store's manifest (known at
admission) or unknown until the version resolves (reserved at
``DSAGENT_NAMESPACE_UNKNOWN_BYTES``), the namespace never holds more than its share.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.errors import NamespaceShareExceeded
from dsagent.format.bundles.bundle import pack
from tests.clock import Clock
from tests.dsagent.conftest import write_tree

CAPACITY = 10_000_000
SHARE = 0.1  # 1 MB: five datasets
DATASET = 200_000  # bytes of each dataset: 4 files of 50 kB
TASKS = 10


def dataset(base: Path, index: int, *, packed: bool) -> DatasetRequest:
    name = f"d{index}"
    source = write_tree(base / "data" / name, {f"f{i}.bin": bytes([index, i]) * (DATASET // 8) for i in range(4)})
    if not packed:
        return DatasetRequest(name, str(source))
    pack(source, base / "data" / "store", name=name)
    return DatasetRequest(name, str(source), str(base / "data" / "store"))


@asynccontextmanager
async def running(tmp_path: Path, **settings: Any) -> AsyncIterator[CacheService]:
    service = CacheService(
        Settings(
            root=tmp_path / "cache",
            sweep_interval=3600,
            local_sources=(tmp_path / "data",),
            capacity_bytes=CAPACITY,
            namespace_share=SHARE,
            **settings,
        ),
        clock=Clock(1_000_000.0),
    )
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def warm_all_at_once(service: CacheService, requests: list[DatasetRequest]) -> list[Any]:
    return await asyncio.gather(
        *(service.submit_task(f"warm.team-a.{r.name}", [r], wait=60, tenant="team-a") for r in requests),
        return_exceptions=True,
    )


def test_pins_sent_at_once_with_declared_sizes_stop_at_the_namespaces_share(tmp_path: Path) -> None:
    requests = [dataset(tmp_path, i, packed=True) for i in range(TASKS)]

    async def scenario() -> None:
        async with running(tmp_path) as service:
            answers = await warm_all_at_once(service, requests)
            ready = [a for a in answers if not isinstance(a, BaseException) and a.state == "ready"]
            refused = [a for a in answers if isinstance(a, NamespaceShareExceeded)]
            assert len(ready) == 5 and len(refused) == 5, answers  # each size known at admission
            assert await service.tenant_pinned("team-a") == 5 * DATASET <= SHARE * CAPACITY
            assert refused[0].details["capacity"] == CAPACITY
            assert 'dsplatform_agent_namespace_refusals_total{namespace="team-a"} 5.0' in await service.metrics_text()
            # another namespace has a share of its own
            other = await service.submit_task("warm.team-b.d9", [requests[9]], wait=60, tenant="team-b")
            assert other.state == "ready"

    asyncio.run(scenario())


def test_pins_of_unknown_size_sent_at_once_never_pass_the_namespaces_share(tmp_path: Path) -> None:
    """Sizes unknown at admission (local sources, no manifest): each reserves 150 kB, so six
    of the ten are admitted. Their versions resolve only then (held back until every task
    was admitted), to 200 kB each: those that no longer fit fail with ``namespace_share``
    before they are bound or fetched."""
    requests = [dataset(tmp_path, i, packed=False) for i in range(TASKS)]

    async def scenario() -> None:
        async with running(tmp_path, namespace_unknown_bytes=150_000) as service:
            admitted_all = asyncio.Event()
            resolve = service._versions.resolve

            async def after_admission(*args: Any, **kwargs: Any) -> Any:
                await admitted_all.wait()
                return await resolve(*args, **kwargs)

            service._versions.resolve = after_admission  # type: ignore[method-assign]
            answers = await asyncio.gather(
                *(service.submit_task(f"warm.team-a.{r.name}", [r], tenant="team-a") for r in requests),
                return_exceptions=True,
            )
            refused = [a for a in answers if isinstance(a, NamespaceShareExceeded)]
            admitted = [a.task_id for a in answers if not isinstance(a, BaseException)]
            assert len(refused) == 4 and len(admitted) == 6, answers  # 6 x 150 kB reserved of 1 MB
            admitted_all.set()
            records = [await settled(service, task_id) for task_id in admitted]
            ready = [r for r in records if r.state == "ready"]
            failed = [r.datasets[0] for r in records if r.state == "failed"]
            assert failed and len(ready) + len(failed) == 6, records  # 6 x 200 kB cannot all fit
            for status in failed:
                assert status.error is not None and status.error["code"] == "namespace_share", status
                assert status.digest is None  # never bound: it pins nothing
            pinned = await service.tenant_pinned("team-a")
            assert pinned == len(ready) * DATASET <= SHARE * CAPACITY
            cached = {row.name for row in await service._db(service.catalog.versions)}
            assert cached == {r.datasets[0].name for r in ready}  # nothing fetched for the refused

    asyncio.run(scenario())


async def settled(service: CacheService, task_id: str) -> Any:
    for _ in range(600):
        record = await service.get_task(task_id)
        if record.state != "pending":
            return record
        await service.task_settled(0.1)
    raise AssertionError(f"task {task_id} did not settle")


def test_a_released_pin_makes_room_and_a_repeated_request_is_admitted(tmp_path: Path) -> None:
    requests = [dataset(tmp_path, i, packed=True) for i in range(6)]

    async def scenario() -> None:
        async with running(tmp_path) as service:
            for request in requests[:5]:
                record = await service.submit_task(f"warm.team-a.{request.name}", [request], wait=60, tenant="team-a")
                assert record.state == "ready"
            try:
                await service.submit_task("warm.team-a.d5", [requests[5]], wait=60, tenant="team-a")
                raise AssertionError("a pin past the share was admitted")
            except NamespaceShareExceeded as exc:
                assert exc.details == {"pinned": 5 * DATASET, "adding": DATASET, "capacity": CAPACITY}
            # renewing what it holds is no new pin
            again = await service.submit_task("warm.team-a.d0", [requests[0]], wait=60, tenant="team-a")
            assert again.state == "ready"
            await service.release_task("warm.team-a.d0")
            record = await service.submit_task("warm.team-a.d5", [requests[5]], wait=60, tenant="team-a")
            assert record.state == "ready" and await service.tenant_pinned("team-a") == 5 * DATASET

    asyncio.run(scenario())
