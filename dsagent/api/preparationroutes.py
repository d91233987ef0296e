"""The ``/v1/preparations`` routes: the next task prepared on this node while the current
one runs (docs/design.md#next-job-preparation).

Who calls it: :func:`dsagent.api.create_app` mounts :data:`router`. The Dataset controller
(an operator: the admin token) puts a preparation for a pod it expects here next, renews it
every pass and deletes it when the plan drops it; ``dsctl ls`` on the node reads them. Every
route is an operator's: a preparation names other tenants' pods and datasets. A pod never
prepares: its own request (``PUT /v1/tasks/{its UID}``) hands a preparation over.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from dsagent.api.routes import BoundedJsonRoute, errors, operator, service, tenant
from dsagent.api.schemas import PreparationIn, PreparationOut, PreparationsOut, ReleaseOut
from dsagent.cache.service import CacheService

#: every route is an operator's (the admin token), so the router asks it of each
router = APIRouter(route_class=BoundedJsonRoute, dependencies=[Depends(operator)])


@router.put(
    "/v1/preparations/{task_id}", response_model=PreparationOut, responses=errors(400, 401, 403, 404, 409, 413, 503)
)
async def prepare(
    task_id: str,
    body: PreparationIn,
    svc: CacheService = Depends(service),
    namespace: str | None = Depends(tenant),
) -> dict[str, Any]:
    """Phase 1 (manifests, reservation up to the first threshold) at once; phase 2 (the bulk
    fetch) when asked and the second threshold allows. Idempotent; renews the lease."""
    return await svc.prepare(
        task_id,
        [d.to_request() for d in body.datasets],
        phase=body.phase,
        first=body.first_threshold,
        second=body.second_threshold,
        tenant=namespace,
    )


@router.get("/v1/preparations", response_model=PreparationsOut, responses=errors(401, 403))
async def list_preparations(svc: CacheService = Depends(service)) -> dict[str, Any]:
    return {"preparations": await svc.preparations.views()}


@router.get("/v1/preparations/{task_id}", response_model=PreparationOut, responses=errors(400, 401, 403, 404))
async def get_preparation(task_id: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    return await svc.preparations.view(task_id)


@router.delete("/v1/preparations/{task_id}", response_model=ReleaseOut, responses=errors(400, 401, 403, 404))
async def release_preparation(task_id: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    """Its reservations and its fetched data's task go: the data becomes evictable."""
    await svc.release_preparation(task_id)
    return {"task": task_id, "released": True}
