"""The service's parts that next-task preparation uses (docs/design.md#next-job-preparation).

Who calls it: :class:`dsagent.cache.service.CacheService`, once, to build its
:class:`dsagent.cache.prepared.Preparations`: manifests read from the bundle store, the
catalog's ready and in-use versions, the space's reservations and the service's own tasks,
each as a plain callable so that :mod:`dsagent.cache.prepared` needs no service.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from dsagent.cache.node import Node
from dsagent.cache.prepared import ServiceParts
from dsagent.cache.space import Space
from dsagent.cache.task import DatasetRequest, TaskRecord
from dsagent.errors import DsagentError, NotFound
from dsagent.format.manifest import read_manifest
from dsagent.format.storage_errors import classify
from dsagent.format.storageconfig import with_config


def service_parts(
    node: Node,
    space: Space,
    *,
    submit_task: Callable[..., Awaitable[TaskRecord]],
    get_task: Callable[[str], Awaitable[TaskRecord]],
    release_task: Callable[[str], Awaitable[None]],
) -> ServiceParts:
    """What the preparations need of the node, its space and the service's tasks, as plain
    callables."""
    settings, store = node.settings, node.store

    async def manifest_of(request: DatasetRequest) -> tuple[str, int]:
        options = with_config(request.storage_options, settings.storage_config, settings.egress_policy)
        assert request.bundles is not None
        bundles = request.bundles
        try:
            found = await node.pools.work(
                lambda: read_manifest(
                    bundles, request.name, storage_options=options, max_files=settings.max_dataset_files
                )
            )
        except DsagentError:
            raise
        except Exception as exc:  # a foreign storage error: the store's fault, said as such
            known = classify(exc, f"dataset {request.name!r}")
            if known is None:
                raise
            raise known from exc
        files = found.file_count + len(found.directories)
        return found.digest, store.allocated(found.total_bytes, files)

    async def is_ready(key: tuple[str, str]) -> bool:
        row = await node.pools.db(node.catalog().version, *key)
        return row is not None and row.state == "ready"

    async def capacity() -> int:
        return int((await space.report()).get("capacityBytes") or 0)

    async def in_use_bytes(exclude: set[tuple[str, str]], except_tasks: Sequence[str] = ()) -> int:
        in_use = await node.pools.db(node.catalog().in_use, node.clock(), tuple(except_tasks))
        rows = await node.pools.db(node.catalog().versions)
        return sum(
            store.allocated(r.size_bytes, r.files)
            for r in rows
            if (r.name, r.digest) in in_use and (r.name, r.digest) not in exclude
        )

    async def submit(tid: str, requests: Sequence[DatasetRequest], tenant: str | None) -> str:
        return (await submit_task(tid, requests, tenant=tenant)).state

    async def task_state(tid: str) -> str | None:
        try:
            return (await get_task(tid)).state
        except NotFound:
            return None

    return ServiceParts(
        now=node.clock,
        lease_ttl=settings.lease_ttl,
        read_manifest=manifest_of,
        is_ready=is_ready,
        is_fetching=node.flights.is_fetching,
        capacity=capacity,
        in_use_bytes=in_use_bytes,
        reserve=space.reserve,
        reservation=space.reservations.get,
        release_reservation=space.release,
        submit=submit,
        task_state=task_state,
        release_task=release_task,
    )


__all__ = ["service_parts"]
