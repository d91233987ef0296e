"""The agent's HTTP API: the FastAPI app factory and the one error edge of the service.

Who calls it: ``dsagent serve`` (under uvicorn, on the unix socket and optionally TCP)
and tests. :func:`create_app` injects the service, the clock and the *companions*: the
node-side parts that run beside the service (the cluster agent in Kubernetes mode, the
kubelet plugins), which the composition root (``dsagent serve``) chooses. The app starts
the service, then the companions, on start-up and stops them in reverse on shutdown; this
layer never imports the edges beside it (``dsagent.nodeagent``, ``dsagent.nodeplugins``). Every error
leaves as JSON ``{"code", "message", "hint"?, "details"?}``:
deliberate errors with their ``http_status``, bad requests as 400/404/405/413, anything
unexpected as a logged 500 that leaks no internals.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from dsagent.api.middleware import HttpMiddleware
from dsagent.errors import DsagentError, InvalidInput

if TYPE_CHECKING:
    # Imported where the app is built, not here: dsctl's client (dsagent.api.client) lives in
    # this package, and importing FastAPI, the routes and the service cost every
    # init-container's ``dsctl cache`` over a second of start-up.
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from dsagent.cache.service import CacheService
    from dsagent.cache.servicehooks import ServiceHooks
    from dsagent.cache.settings import Settings

log = logging.getLogger("dsagent.api")


class BodyTooLarge(InvalidInput):
    http_status = 413
    code = "body_too_large"


class Companion(Protocol):
    """A part that runs beside the service: started after it, stopped before it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


#: Builds a companion for the running service.
CompanionFactory = Callable[["CacheService"], Companion]


def create_app(
    settings: Settings,
    *,
    service: CacheService | None = None,
    clock: Callable[[], float] = time.time,
    companions: Sequence[CompanionFactory] = (),
    hooks: ServiceHooks | None = None,
) -> FastAPI:
    """The agent's ASGI app; ``service`` defaults to a :class:`CacheService` on ``settings``,
    built with ``hooks`` (what cluster mode lends it, :mod:`dsagent.cache.servicehooks`)."""
    from fastapi import FastAPI

    from dsagent import __version__
    from dsagent.api.audit import OperatorAudit
    from dsagent.api.identity import own_pod_uid
    from dsagent.api.operations import Operations
    from dsagent.api.preparationroutes import router as preparation_router
    from dsagent.api.routes import router
    from dsagent.api.striperoutes import router as stripe_router
    from dsagent.api.timing import RouteTiming
    from dsagent.cache.service import CacheService
    from dsagent.cache.servicehooks import ServiceHooks

    if service is not None and hooks is not None:
        raise ValueError("hooks are for the service create_app builds; a given service has its own")
    svc = service if service is not None else CacheService(settings, clock=clock, hooks=hooks or ServiceHooks())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        running: list[Companion] = []
        parts = [factory(svc) for factory in companions]
        await svc.start()
        try:
            for part in parts:
                await part.start()
                running.append(part)
            yield
        finally:
            await app.state.operations.close()
            for part in reversed(running):
                await part.stop()
            await svc.stop()

    app = FastAPI(
        title="dsagent",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/v1/openapi.json",
    )
    app.state.service = svc
    app.state.operations = Operations(clock=clock)
    app.state.settings = settings
    app.state.own_pod_uid = own_pod_uid(settings.proc_root)  # kubectl exec into the agent is an operator
    app.include_router(router)
    app.include_router(stripe_router)
    app.include_router(preparation_router)
    app.openapi = functools.partial(openapi_document, app)  # type: ignore[method-assign]
    _install_error_edge(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(OperatorAudit, metrics=svc.metrics)  # who pinned or evicted what, for which Dataset
    app.add_middleware(RouteTiming, metrics=svc.metrics)  # outermost: refused bodies are timed too
    return app


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document without the 422 it adds to every route with inputs: the error
    edge answers validation errors as 400 ``invalid_input`` (declared per route)."""
    from fastapi.openapi.utils import get_openapi

    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes, description=(
        "The dsagent node API. Every error answers an ErrorOut body {code, message, hint?, details?}; "
        "the codes, statuses and dsctl exit codes are in the documentation's exit codes reference."
    ))  # fmt: skip
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    app.openapi_schema = schema
    return schema


def _error(exc: DsagentError) -> JSONResponse:
    from fastapi.responses import JSONResponse

    return JSONResponse(exc.to_dict(), status_code=exc.http_status)


def _install_error_edge(app: FastAPI) -> None:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(DsagentError)
    async def deliberate(_: Request, exc: DsagentError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"where": ".".join(str(p) for p in e.get("loc", ())), "problem": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        summary = "; ".join(f"{p['where']}: {p['problem']}" for p in problems[:5])
        return _error(InvalidInput(f"invalid request: {summary}", errors=problems))

    @app.exception_handler(StarletteHTTPException)
    async def http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"code": code, "message": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return JSONResponse({"code": "internal", "message": "internal error; see the agent's log"}, status_code=500)


class BodyLimit(HttpMiddleware):
    """Refuse request bodies over ``max_bytes`` (by header, and while streaming)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise BodyTooLarge(f"request body over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = BodyTooLarge(
            f"request body over {self.max_bytes} bytes", hint="datasets lists are small; check what is being sent"
        )
        await _error(error)(scope, receive, send)


__all__ = ["BodyTooLarge", "Companion", "CompanionFactory", "create_app", "openapi_document"]
