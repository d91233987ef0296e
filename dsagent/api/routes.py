"""The ``/v1`` routes: they convert between the wire and the service, nothing more.

Who calls it: :func:`dsagent.api.create_app` mounts :data:`router`. Every request that
changes state (tasks, evictions) needs the admin token when it came over TCP, where
anyone on the network could otherwise make the node fetch or drop data; reads (inventory,
metrics, probes) stay open for the extender and Prometheus. The unix socket is guarded by
its file permissions.
"""

from __future__ import annotations

import hmac
from typing import Any

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from dsagent.api.schemas import EvictIn, TaskIn, eviction_out, task_out
from dsagent.errors import Unauthorized
from dsagent.cache.peers import PEER_HEADER, check_peer_token
from dsagent.cache.service import CacheService
from dsagent.format.names import validate_digest

router = APIRouter()


def service(request: Request) -> CacheService:
    svc: CacheService = request.app.state.service
    return svc


def over_unix_socket(request: Request) -> bool:
    """uvicorn reports no server address for a unix socket connection, a (host, port) for TCP."""
    server = request.scope.get("server")
    return server is None or not isinstance(server, (tuple, list)) or server[1] is None


def require_admin(request: Request) -> None:
    if over_unix_socket(request):
        return
    token = request.app.state.settings.admin_token
    if token is None:
        raise Unauthorized("operator actions over TCP need an admin token, and this agent has none", hint="set DSAGENT_ADMIN_TOKEN on the agent, or use its unix socket")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("a valid admin token is required for this action", hint="send 'Authorization: Bearer <token>' (dsctl: --token or DSAGENT_ADMIN_TOKEN)")


@router.put("/v1/tasks/{task_id}", dependencies=[Depends(require_admin)])
async def submit_task(task_id: str, body: TaskIn, svc: CacheService = Depends(service), wait: float = Query(0.0, ge=0.0, le=3600.0)) -> dict[str, Any]:
    record = await svc.submit_task(task_id, [d.to_request() for d in body.datasets], wait=wait)
    return task_out(record)


@router.get("/v1/tasks/{task_id}")
async def get_task(task_id: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    return task_out(await svc.get_task(task_id))


@router.delete("/v1/tasks/{task_id}", dependencies=[Depends(require_admin)])
async def release_task(task_id: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    await svc.release_task(task_id)
    return {"task": task_id, "released": True}


@router.get("/v1/datasets")
async def list_datasets(svc: CacheService = Depends(service)) -> dict[str, Any]:
    return {"datasets": await svc.datasets(), **await svc.space()}


@router.get("/v1/datasets/{name}")
async def get_dataset(name: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    return {"name": name, "versions": await svc.dataset(name)}


@router.delete("/v1/datasets/{name}", dependencies=[Depends(require_admin)])
async def evict_dataset(
    name: str, svc: CacheService = Depends(service), force: bool = False, dry_run: bool = Query(False, alias="dryRun")
) -> dict[str, Any]:
    return eviction_out(await svc.evict(names=[name], force=force, dry_run=dry_run))


@router.post("/v1/evict", dependencies=[Depends(require_admin)])
async def evict(body: EvictIn, svc: CacheService = Depends(service)) -> dict[str, Any]:
    result = await svc.evict(names=body.names, mode=body.mode, force=body.force, dry_run=body.dry_run, free_bytes=body.bytes or 0)
    return eviction_out(result)


@router.get("/v1/inventory")
async def inventory(svc: CacheService = Depends(service)) -> dict[str, Any]:
    return await svc.inventory()


def require_peer(request: Request) -> None:
    """Peer endpoints need the agents' shared peer token on every transport (pods never hold it)."""
    check_peer_token(request.app.state.settings, request.headers.get("authorization", ""))


@router.get("/v1/peer/bundles/{digest}", dependencies=[Depends(require_peer)])
async def peer_bundle(digest: str, request: Request, svc: CacheService = Depends(service)) -> StreamingResponse:
    """A bundle of a ready version, re-packed and streamed to another agent (docs/design.md#peers)."""
    validate_digest(digest)
    peer = (request.headers.get(PEER_HEADER) or (request.client.host if request.client else "") or "unknown")[:253]
    chunks, end = await svc.peer_server.open(digest, peer)

    async def body() -> AsyncIterator[bytes]:
        try:
            while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
                yield chunk
        finally:
            end()

    return StreamingResponse(body(), media_type="application/zstd", headers={"Cache-Control": "no-store"})


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(response: Response, svc: CacheService = Depends(service)) -> dict[str, str]:
    if not svc.started:
        response.status_code = 503
        return {"status": "starting"}
    return {"status": "ready"}


@router.get("/metrics")
async def metrics(svc: CacheService = Depends(service)) -> Response:
    return Response(await svc.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")
