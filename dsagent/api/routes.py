"""The ``/v1`` routes: they convert between the wire and the service, nothing more.

Who calls it: :func:`dsagent.api.create_app` mounts :data:`router`. Who may do what is
:mod:`dsagent.api.identity`: an operator (admin token, or a process on the node outside
any pod) anything; a pod only its own task (its UID); evictions need an operator; over
TCP without the token only reads (inventory, metrics, probes stay open for the extender
and Prometheus).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response

from dsagent.api.schemas import EvictIn, TaskIn, eviction_out, task_out
from dsagent.api.identity import Caller, caller_identity, require_operator, require_task
from dsagent.cache.service import CacheService

router = APIRouter()


def service(request: Request) -> CacheService:
    svc: CacheService = request.app.state.service
    return svc


def caller(request: Request) -> Caller:
    return caller_identity(request)


def operator(who: Caller = Depends(caller)) -> None:
    require_operator(who)


@router.put("/v1/tasks/{task_id}")
async def submit_task(task_id: str, body: TaskIn, svc: CacheService = Depends(service), wait: float = Query(0.0, ge=0.0, le=3600.0), who: Caller = Depends(caller)) -> dict[str, Any]:
    require_task(who, task_id, write=True)
    record = await svc.submit_task(task_id, [d.to_request() for d in body.datasets], wait=wait)
    return task_out(record)


@router.get("/v1/tasks/{task_id}")
async def get_task(task_id: str, svc: CacheService = Depends(service), who: Caller = Depends(caller)) -> dict[str, Any]:
    require_task(who, task_id, write=False)
    return task_out(await svc.get_task(task_id))


@router.delete("/v1/tasks/{task_id}")
async def release_task(task_id: str, svc: CacheService = Depends(service), who: Caller = Depends(caller)) -> dict[str, Any]:
    require_task(who, task_id, write=True)
    await svc.release_task(task_id)
    return {"task": task_id, "released": True}


@router.get("/v1/datasets")
async def list_datasets(svc: CacheService = Depends(service)) -> dict[str, Any]:
    return {"datasets": await svc.datasets(), **await svc.space()}


@router.get("/v1/datasets/{name}")
async def get_dataset(name: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    return {"name": name, "versions": await svc.dataset(name)}


@router.delete("/v1/datasets/{name}", dependencies=[Depends(operator)])
async def evict_dataset(
    name: str, svc: CacheService = Depends(service), force: bool = False, dry_run: bool = Query(False, alias="dryRun")
) -> dict[str, Any]:
    return eviction_out(await svc.evict(names=[name], force=force, dry_run=dry_run))


@router.post("/v1/evict", dependencies=[Depends(operator)])
async def evict(body: EvictIn, svc: CacheService = Depends(service)) -> dict[str, Any]:
    result = await svc.evict(names=body.names, mode=body.mode, force=body.force, dry_run=body.dry_run, free_bytes=body.bytes or 0)
    return eviction_out(result)


@router.get("/v1/inventory")
async def inventory(svc: CacheService = Depends(service)) -> dict[str, Any]:
    return await svc.inventory()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(response: Response, svc: CacheService = Depends(service)) -> dict[str, str]:
    if not svc.started:
        response.status_code = 503
        return {"status": "starting"}
    waited = svc.pools.stalled(svc.settings.stall_timeout)
    if waited:
        response.status_code = 503
        return {"status": "stalled", "detail": f"blocking work has waited {waited:.0f} s for a worker thread"}
    return {"status": "ready"}


@router.get("/metrics")
async def metrics(svc: CacheService = Depends(service)) -> Response:
    return Response(await svc.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")
