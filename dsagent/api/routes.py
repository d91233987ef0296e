"""The ``/v1`` routes: they convert between the wire and the service, nothing more.

Who calls it: :func:`dsagent.api.create_app` mounts :data:`router`. Who may do what is
:mod:`dsagent.api.identity`: an operator (admin token, or a process on the node outside
any pod) anything; a pod only its own task (its UID); evictions need an operator; over
TCP without the token only reads (inventory, metrics, probes stay open for the extender
and Prometheus).

Request bodies are parsed by :mod:`dsplatform.boundedjson` (:class:`BoundedJsonRoute`), the
one parse of another party's JSON: a body nested deeper than ``boundedjson.MAX_DEPTH``
(32; a task is 4 levels and its storage options the rest) or that is not JSON or not UTF-8
is a 400 ``invalid_input`` saying which, where FastAPI's own parse accepted any depth below
the interpreter's recursion limit and answered anything else "There was an error parsing
the body". The size is ``DSAGENT_MAX_BODY``'s, checked first by
:class:`dsagent.api.BodyLimit` (413).

Each route declares its ``response_model`` and the error statuses it can actually answer
(:func:`errors`, all with the :class:`~dsagent.api.schemas.ErrorOut` body); FastAPI's
automatic 422 is removed from the document by :func:`dsagent.api.openapi_document`,
because validation errors are answered as 400 ``invalid_input``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from dsagent.api.clientgone import unless_gone
from dsagent.api.identity import (
    Caller,
    acting_for,
    bearer_matches,
    caller_identity,
    require_operator,
    require_task,
)
from dsagent.api.operations import DEFAULT_WAIT_SECONDS, MAX_WAIT_SECONDS, Operations, operation_out
from dsagent.api.schemas import (
    DatasetsOut,
    DatasetVersionsOut,
    ErrorOut,
    EvictIn,
    EvictionOut,
    InventoryOut,
    OperationOut,
    ReleaseOut,
    StatusOut,
    TaskIn,
    TaskOut,
    TasksOut,
    eviction_out,
)
from dsagent.cache.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dsagent.cache.service import CacheService
from dsagent.errors import DsagentError, Forbidden, InvalidInput, NotFound, Unauthorized
from dsagent.format.names import validate_digest
from dsplatform import boundedjson, probes
from dsplatform.wire import peerbundle
from dsplatform.wire.agenttask import task_status


class _BoundedJsonRequest(Request):
    """A request whose JSON body FastAPI reads through :func:`dsplatform.boundedjson.loads`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            limit: int = self.app.state.settings.max_body_bytes
            self._json = boundedjson.loads(await self.body(), what="request body", max_bytes=limit)
        return self._json


class BoundedJsonRoute(APIRoute):
    """Routes whose bodies are parsed bounded; a refusal is a 400 ``invalid_input`` with
    boundedjson's one-line reason, and a body over the limit without a Content-Length a 413
    (FastAPI turns any error while it reads and parses a body into a bare 400)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            try:
                return await handler(_BoundedJsonRequest(request.scope, request.receive))
            except HTTPException as exc:
                cause = exc.__cause__
                if isinstance(cause, boundedjson.JsonRefused):
                    raise InvalidInput(cause.message, hint="send a JSON object (see /v1/openapi.json)") from None
                if isinstance(cause, DsagentError):  # BodyTooLarge while a body without a length streams in
                    raise cause from None
                raise

        return bounded


router = APIRouter(route_class=BoundedJsonRoute)

ERROR_STATUSES: dict[int, str] = {
    400: "Invalid input: names, URLs (a malformed URL), fields, query values (invalid_input, ...)",
    401: "An operator action over TCP without a valid admin token (unauthorized)",
    403: "The store refused the agent's credentials (credentials) or the action (storage_forbidden); "
    "a pod acting on another pod's task, or evicting, or reading a striped version of another namespace "
    "or one its task and annotation do not name (forbidden); "
    "in cluster mode, a pod-UID task for a pod not on this node (task_not_on_node); "
    "a pin for a namespace that holds its share of the cache (namespace_share)",
    404: "No such task or dataset (not_found); a source or bundle store that does not exist",
    409: "In use, being fetched, or a task repeated with other datasets (conflict)",
    410: "A striped version the store no longer holds, another version of the name having replaced it "
    "(superseded): create the pod again",
    413: "Request body over DSAGENT_MAX_BODY (body_too_large)",
    425: "This agent is downloading that bundle right now (peer_fetching): ask again shortly",
    429: "Too many bundles being served to this peer at once (peer_busy), or this caller's bundle streams "
    "already hold its share of the node's (reader_busy): retry later",
    500: "A bug in the agent (internal); details only in the agent's log",
    503: "The source or bundle store is unreachable (source_unavailable): worth retrying; "
    "a new task while the agent stops (agent_stopping): ask the agent that replaces it",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses a route can answer (500 always)."""
    return {status: {"model": ErrorOut, "description": ERROR_STATUSES[status]} for status in sorted({*statuses, 500})}


#: ``wait`` of an action that may run long: how long the request waits for it to finish
#: before it answers 202 with the operation (:mod:`dsagent.api.operations`)
WAIT = Query(DEFAULT_WAIT_SECONDS, ge=0.0, le=MAX_WAIT_SECONDS)
#: ``wait`` of a poll of an operation
WAIT_POLL = Query(0.0, ge=0.0, le=MAX_WAIT_SECONDS)
#: the answer of an action still running
ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {
        "model": OperationOut,
        "description": "Still running after `wait` seconds: the operation, to follow at its `href` "
        "(also the `Location` header) with GET /v1/operations/{id}",
    }
}


def service(request: Request) -> CacheService:
    svc: CacheService = request.app.state.service
    return svc


def caller(request: Request) -> Caller:
    return caller_identity(request)


def operator(who: Caller = Depends(caller)) -> None:
    require_operator(who)


def tenant(request: Request, who: Caller = Depends(caller)) -> str | None:
    """The namespace an operator's request acts for (``X-Dsagent-For``), or None."""
    dataset = acting_for(request, who)
    return dataset[0] if dataset is not None else None


@router.put("/v1/tasks/{task_id}", response_model=TaskOut, responses=errors(400, 401, 403, 404, 409, 413, 503))
async def submit_task(
    task_id: str,
    body: TaskIn,
    request: Request,
    svc: CacheService = Depends(service),
    wait: float = Query(0.0, ge=0.0, le=3600.0),
    who: Caller = Depends(caller),
    namespace: str | None = Depends(tenant),
) -> dict[str, Any]:
    """Ask for a task's datasets; ``wait`` then holds the answer until their work ends (at
    most that many seconds), while the client stays."""
    require_task(who, task_id, write=True)
    record = await svc.submit_task(task_id, [d.to_request() for d in body.datasets], tenant=namespace)
    if wait:
        # the wait ends when the client goes (the work goes on): no handler waits for nobody
        record = await unless_gone(request.receive, svc.get_task(record.task_id, wait=wait))
    return dict(task_status(record))


@router.get("/v1/tasks", response_model=TasksOut, responses=errors())
async def list_tasks(svc: CacheService = Depends(service), who: Caller = Depends(caller)) -> dict[str, Any]:
    """Every task the caller may read (what ``dsctl tasks`` shows: the ids ``dsctl release`` takes)."""
    tasks = []
    for task_id in await svc.task_ids():
        try:
            require_task(who, task_id, write=False)
            tasks.append(dict(task_status(await svc.get_task(task_id))))
        except (Forbidden, Unauthorized, NotFound):  # another pod's, or released meanwhile
            continue
    return {"tasks": tasks}


@router.get("/v1/tasks/{task_id}", response_model=TaskOut, responses=errors(400, 403, 404))
async def get_task(
    task_id: str,
    request: Request,
    svc: CacheService = Depends(service),
    wait: float = Query(0.0, ge=0.0, le=3600.0),
    who: Caller = Depends(caller),
) -> dict[str, Any]:
    """Where the task stands; ``wait`` holds the answer until its running work ends (at
    most that many seconds, while the client stays): a client following it long-polls
    instead of sleeping."""
    require_task(who, task_id, write=False)
    looking = svc.get_task(task_id, wait=wait)
    return dict(task_status(await (unless_gone(request.receive, looking) if wait else looking)))


@router.delete(
    "/v1/tasks/{task_id}",
    response_model=ReleaseOut,
    responses={**errors(400, 401, 403, 404), **ACCEPTED},
)
async def release_task(
    task_id: str,
    request: Request,
    svc: CacheService = Depends(service),
    who: Caller = Depends(caller),
    wait: float = WAIT,
) -> Any:
    require_task(who, task_id, write=True)

    async def release() -> dict[str, Any]:
        await svc.release_task(task_id)
        return {"task": task_id, "released": True}

    return await _as_operation(request, "release", _owner(who), f"task={task_id}", release, wait)


@router.get("/v1/datasets", response_model=DatasetsOut, responses=errors())
async def list_datasets(svc: CacheService = Depends(service)) -> dict[str, Any]:
    return {"datasets": await svc.datasets(), **await svc.space()}


@router.get("/v1/datasets/{name}", response_model=DatasetVersionsOut, responses=errors(400, 404))
async def get_dataset(name: str, svc: CacheService = Depends(service)) -> dict[str, Any]:
    return {"name": name, "versions": await svc.dataset(name)}


@router.delete(
    "/v1/datasets/{name}",
    dependencies=[Depends(operator)],
    response_model=EvictionOut,
    responses={**errors(400, 401, 403, 404, 409, 503), **ACCEPTED},
)
async def evict_dataset(
    name: str,
    request: Request,
    svc: CacheService = Depends(service),
    force: bool = False,
    dry_run: bool = Query(False, alias="dryRun"),
    namespace: str | None = Depends(tenant),
    wait: float = WAIT,
) -> Any:
    async def evict() -> dict[str, Any]:
        return eviction_out(await svc.evict(names=[name], force=force, dry_run=dry_run, tenant=namespace))

    return await _as_operation(request, "evict", "operator", f"names={name}", evict, wait)


@router.post(
    "/v1/evict",
    dependencies=[Depends(operator)],
    response_model=EvictionOut,
    responses={**errors(400, 401, 403, 404, 409, 413, 503), **ACCEPTED},
)
async def evict(
    body: EvictIn,
    request: Request,
    svc: CacheService = Depends(service),
    namespace: str | None = Depends(tenant),
    wait: float = WAIT,
) -> Any:
    async def evict() -> dict[str, Any]:
        result = await svc.evict(
            names=body.names,
            mode=body.mode,
            force=body.force,
            dry_run=body.dry_run,
            free_bytes=body.bytes or 0,
            tenant=namespace,
        )
        return eviction_out(result)

    target = f"names={','.join(body.names)}" if body.mode == "names" else f"mode={body.mode}"
    return await _as_operation(request, "evict", "operator", target, evict, wait)


@router.get("/v1/operations/{op_id}", response_model=OperationOut, responses=errors(400, 401, 403, 404))
async def get_operation(op_id: str, request: Request, who: Caller = Depends(caller), wait: float = WAIT_POLL) -> Any:
    """An operation's state; ``wait`` holds the answer until it finishes (at most
    :data:`~dsagent.api.operations.MAX_WAIT_SECONDS`)."""
    ops: Operations = request.app.state.operations
    op = ops.get(op_id)
    if not (who.operator or (who.kind == "pod" and op.owner == _owner(who))):
        require_operator(who)  # 401 without the token, 403 for another pod
    await unless_gone(request.receive, ops.wait(op, wait))  # ends when the client goes
    return operation_out(op)


def _owner(who: Caller) -> str:
    """Who may read an operation besides an operator: the pod that asked for it."""
    if who.kind == "pod" and who.pod_uid is not None:
        return f"pod:{who.pod_uid}"
    return "operator"  # the only other caller an action admits


async def _as_operation(
    request: Request,
    kind: str,
    owner: str,
    target: str,
    action: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
    wait: float,
) -> Any:
    """Run ``action`` as an operation (:mod:`dsagent.api.operations`): its result (or its
    error) when it finishes within ``wait``, else 202 with the operation to follow."""
    ops: Operations = request.app.state.operations
    op = ops.start(kind, owner, target, action)
    if await unless_gone(request.receive, ops.wait(op, wait)):  # ends when the client goes
        return op.result()  # raises the action's own error: 409, 404, ... as before
    return JSONResponse(operation_out(op), status_code=202, headers={"Location": f"/v1/operations/{op.id}"})


@router.get("/v1/inventory", response_model=InventoryOut, responses=errors())
async def inventory(svc: CacheService = Depends(service)) -> dict[str, Any]:
    return await svc.inventory()


def require_peer(request: Request) -> None:
    """Peer endpoints need the agents' shared peer token on every transport (pods never hold it)."""
    token = request.app.state.settings.peer_token
    if token is None:
        raise Unauthorized(
            "this agent serves no peers (it has no peer token)", hint="set DSAGENT_PEER_TOKEN on every agent"
        )
    if not bearer_matches(request.headers.get("authorization", ""), token):
        raise Unauthorized(
            "a valid peer token is required", hint="agents send 'Authorization: Bearer <DSAGENT_PEER_TOKEN>'"
        )


@router.get(
    "/v1/peer/bundles/{digest}",
    dependencies=[Depends(require_peer)],
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/zstd": {"schema": {"type": "string", "format": "binary"}}},
            "description": "The bundle, tar+zstd, re-packed from the files of a ready version "
            "(or of one being fetched that finished this bundle)",
        },
        **errors(400, 401, 404, 425, 429, 503),
    },
)
async def peer_bundle(digest: str, request: Request, svc: CacheService = Depends(service)) -> StreamingResponse:
    """A finished bundle, re-packed and streamed to another agent (docs/design.md#peers).
    The peer says when a reader waits for it (:mod:`dsplatform.wire.peerbundle`): only then
    does a share holding it ``storeOnDemand`` read it from the store (docs/design-striping.md#agent)."""
    validate_digest(digest)
    peer = peer_identity(request)
    reader = peerbundle.reader_waits(request.headers.get(peerbundle.READER_HEADER))
    chunks, end = await svc.peer_server.open(digest, peer, reader=reader)

    async def body() -> AsyncIterator[bytes]:
        try:
            while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
                yield chunk
        finally:
            end()

    return StreamingResponse(body(), media_type="application/zstd", headers={"Cache-Control": "no-store"})


def peer_identity(request: Request) -> str:
    """Who a peer is, for its upload limits: the address it connected from, which it proved by
    completing the TCP handshake. Every peer holds the same token, so the token does not tell
    them apart, and the ``X-Dsagent-Peer`` header is whatever the peer chose to write (keyed on
    it, one peer got a fresh per-peer allowance per name)."""
    return (request.client.host if request.client else "") or "local"


@router.get("/healthz", response_model=StatusOut)
async def healthz() -> dict[str, str]:
    return probes.body(probes.OK)  # the one probe shape of every process (docs/design.md#probes)


@router.get(
    "/readyz",
    response_model=StatusOut,
    responses={503: {"model": StatusOut, "description": "The agent is starting, stalled or stopping"}},
)
async def readyz(response: Response, svc: CacheService = Depends(service)) -> dict[str, str]:
    if not svc.started:
        answer = probes.body("starting", "the cache service is recovering its catalog")
    elif svc.handoff.stopping:
        answer = probes.body("stopping", "told to stop: serving its stripe shares to their new owners, no new task")
    elif waited := svc.pools.stalled(svc.settings.stall_timeout):
        answer = probes.body("stalled", f"blocking work has waited {waited:.0f} s for a worker thread")
    else:
        answer = probes.body(probes.READY)
    response.status_code = probes.http_status(answer["status"])
    return answer


@router.get("/metrics")
async def metrics(svc: CacheService = Depends(service)) -> Response:
    return Response(await svc.metrics_text(), media_type=METRICS_CONTENT_TYPE)
