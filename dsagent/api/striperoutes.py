"""The ``/v1/stripes`` routes: this node's part in striped versions (docs/design-striping.md).

Who calls it: :func:`dsagent.api.create_app` mounts :data:`router`. An operator (the
controller, or ``dsctl`` on the node) asks the node to hold its share of a version, for the
Dataset its ``X-Dsagent-For`` names; anyone may read a share's status (as the inventory);
this node's pods (and operators) read bundles through it, as a plain tar, whether the node
holds them or fetches them into its window. A pod reads only the versions of its own
namespace that its own task (its UID) or its annotation names
(:mod:`dsagent.cache.striped.stripereaders`); each caller's streams are bounded and a stream
left unread is cut (:mod:`dsagent.cache.striped.readerstreams`). An operator releases a
share (``DELETE``), which also goes when nobody holds it again within its lease. Peers never
use these routes: they read held bundles with ``/v1/peer/bundles``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from dsagent.api.clientgone import unless_gone
from dsagent.api.identity import CUT_KEY, Caller, acting_for, require_operator
from dsagent.api.routes import BoundedJsonRoute, caller, errors, operator, service
from dsagent.api.schemas import StripeIn, StripeOut, StripeReleaseOut
from dsagent.cache.service import CacheService
from dsagent.cache.striped.readerstreams import OPERATORS
from dsagent.cache.striped.stripereaders import pod_reader
from dsagent.errors import Forbidden, InvalidInput
from dsagent.format.bundles.packwriter import tar_stream
from dsagent.format.names import validate_digest, validate_name
from dsplatform.wire.stripehold import KEEP_WHOLE

router = APIRouter(route_class=BoundedJsonRoute)


@router.put(
    "/v1/stripes/{name}",
    dependencies=[Depends(operator)],
    response_model=StripeOut,
    responses=errors(400, 401, 403, 404, 413, 503),
)
async def hold_stripe(
    name: str, body: StripeIn, request: Request, svc: CacheService = Depends(service), who: Caller = Depends(caller)
) -> dict[str, Any]:
    """Hold this node's share of ``name`` in the group ``members`` (fetching starts at once),
    for the Dataset ``X-Dsagent-For`` names: only pods of its namespace read the share."""
    validate_name(name)
    if body.digest is not None:
        validate_digest(body.digest)
    held_for = acting_for(request, who)
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
        holders=[held_for] if held_for is not None else (),
        whole=body.whole,
        store_on_demand=body.store_on_demand,
    )


@router.delete(
    "/v1/stripes/{name}",
    dependencies=[Depends(operator)],
    response_model=StripeReleaseOut,
    responses=errors(400, 401, 403, 404),
)
async def release_stripe(
    name: str, digest: str | None = None, keep: str | None = None, svc: CacheService = Depends(service)
) -> dict[str, Any]:
    """Drop this node's share of ``name`` (of version ``digest`` only, when given): its
    files and window go now. A share nobody holds again also goes when its lease lapses.
    ``keep=whole`` (the controller, taking the node out of the group): a share holding the
    version whole stays as a copy with no lease, until the cache evicts it (one not yet
    complete keeps the bundles it holds and stops filling)."""
    validate_name(name)
    if digest is not None:
        validate_digest(digest)
    if keep not in (None, KEEP_WHOLE):
        raise InvalidInput(f"keep is {KEEP_WHOLE!r} or absent, not {keep[:40]!r}")
    return {"name": name, "released": await svc.stripes.release(name, digest, keep_whole=keep == KEEP_WHOLE)}


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
        **errors(400, 401, 403, 404, 410, 429, 503),
    },
)
async def stripe_bundle(
    name: str,
    digest: str,
    bundle: str,
    request: Request,
    svc: CacheService = Depends(service),
    who: Caller = Depends(caller),
) -> StreamingResponse:
    """A bundle of a striped version for this node's reader: from the share, or fetched into
    the window from its owner (then the other members, then the store). A pod reads only a
    version of its own namespace that its task or annotation names (403 otherwise); 429 when
    its streams already hold its share of the node's; a stream left unread is cut. A reader
    that closes its connection before its bundle is there stops waiting for it (the window
    stops a fetch no reader waits for)."""
    if not who.operator:
        if who.kind == "anonymous":
            require_operator(who)  # 401: TCP without the token
        if who.kind != "pod" or who.pod_uid is None:
            raise Forbidden(f"only this node's pods and operators read stripe bundles ({who.why})")
    validate_name(name)
    validate_digest(digest)
    validate_digest(bundle)
    if not who.operator and who.pod_uid is not None:
        # a pod acts only on its own task: it reads its own namespace's stripes that its task or annotation names
        await svc.stripes.check_reader((name, digest), await pod_reader(svc, who.pod_uid))
    reader = OPERATORS if who.operator else str(who.pod_uid)
    # a reader that goes while its bundle is fetched into the window stops waiting for it
    opening = svc.stripes.open_bundle(name, digest, bundle, caller=reader)
    directory, entries, stream = await unless_gone(request.receive, opening)
    chunks = tar_stream(directory, entries)
    stream.start(cut=(request.scope.get("state") or {}).get(CUT_KEY))

    async def body() -> AsyncIterator[bytes]:
        try:
            while not stream.closed and (chunk := await run_in_threadpool(next, chunks, None)) is not None:
                stream.read()
                yield chunk  # back once the reader took it
                stream.read()
        finally:
            chunks.close()
            stream.close()

    return StreamingResponse(body(), media_type="application/x-tar", headers={"Cache-Control": "no-store"})
