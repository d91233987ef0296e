"""The ``/v1/stripes`` routes: this node's part in striped versions (docs/design-striping.md).

Who calls it: :func:`dsagent.api.create_app` mounts :data:`router`. An operator (the
controller, or ``dsctl`` on the node) asks the node to hold its share of a version; anyone
may read a share's status (as the inventory); this node's pods (and operators) read bundles
through it, as a plain tar, whether the node holds them or fetches them into its window.
A pod reads only the versions of datasets its own task (its UID) or its annotation names;
an operator releases a share (``DELETE``), which also goes when nobody holds it again within
its lease. Peers never use these routes: they read held bundles with ``/v1/peer/bundles``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from dsagent.api.identity import Caller, require_operator
from dsagent.api.routes import BoundedJsonRoute, caller, errors, operator, service
from dsagent.api.schemas import StripeIn, StripeOut, StripeReleaseOut
from dsagent.cache.service import CacheService
from dsagent.errors import Forbidden
from dsagent.format.bundles.packwriter import tar_stream
from dsagent.format.names import validate_digest, validate_name

router = APIRouter(route_class=BoundedJsonRoute)


@router.put(
    "/v1/stripes/{name}",
    dependencies=[Depends(operator)],
    response_model=StripeOut,
    responses=errors(400, 401, 403, 404, 413, 503),
)
async def hold_stripe(name: str, body: StripeIn, svc: CacheService = Depends(service)) -> dict[str, Any]:
    """Hold this node's share of ``name`` in the group ``members`` (fetching starts at once)."""
    validate_name(name)
    if body.digest is not None:
        validate_digest(body.digest)
    return await svc.stripes.hold(
        name,
        body.store,
        body.members,
        body.peers,
        no_share=body.no_share,
        digest=body.digest,
        storage_options=body.storage_options,
        ready_after=body.ready_after,
        lease=body.lease_seconds,
    )


@router.delete(
    "/v1/stripes/{name}",
    dependencies=[Depends(operator)],
    response_model=StripeReleaseOut,
    responses=errors(400, 401, 403, 404),
)
async def release_stripe(name: str, digest: str | None = None, svc: CacheService = Depends(service)) -> dict[str, Any]:
    """Drop this node's share of ``name`` (of version ``digest`` only, when given): its
    files and window go now. A share nobody holds again also goes when its lease lapses."""
    validate_name(name)
    if digest is not None:
        validate_digest(digest)
    return {"name": name, "released": await svc.stripes.release(name, digest)}


@router.get("/v1/stripes/{name}/{digest}", response_model=StripeOut, responses=errors(400, 404, 410))
async def stripe_status(name: str, digest: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    """This node's share of ``name@digest``: 404 while it holds none (yet), 410 when the
    version is gone for good (superseded in the store: docs/design-striping.md#superseded)."""
    validate_name(name)
    validate_digest(digest)
    await svc.stripes.held((name, digest))
    return svc.stripes.status((name, digest))


@router.get(
    "/v1/stripes/{name}/{digest}/bundles/{bundle}",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
            "description": "The bundle's files as a plain tar, verified when they reached this node",
        },
        **errors(400, 401, 403, 404, 410, 503),
    },
)
async def stripe_bundle(
    name: str, digest: str, bundle: str, svc: CacheService = Depends(service), who: Caller = Depends(caller)
) -> StreamingResponse:
    """A bundle of a striped version for this node's reader: from the share, or fetched into
    the window from its owner (then the other members, then the store)."""
    if not who.operator:
        if who.kind == "anonymous":
            require_operator(who)  # 401: TCP without the token
        if who.kind != "pod" or who.pod_uid is None:
            raise Forbidden(f"only this node's pods and operators read stripe bundles ({who.why})")
    validate_name(name)
    validate_digest(digest)
    validate_digest(bundle)
    if not who.operator and not await svc.pod_names_dataset(who.pod_uid or "", name):
        # a pod acts only on its own task: it reads the stripes its task (or annotation) names
        raise Forbidden(f"this pod's task does not name dataset {name!r}", hint="list it in the pod's datasets")
    directory, entries, done = await svc.stripes.open_bundle(name, digest, bundle)
    chunks = tar_stream(directory, entries)

    async def body() -> AsyncIterator[bytes]:
        try:
            while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
                yield chunk
        finally:
            chunks.close()
            done()

    return StreamingResponse(body(), media_type="application/x-tar", headers={"Cache-Control": "no-store"})
