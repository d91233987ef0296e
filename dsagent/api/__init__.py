"""The agent's HTTP API: the FastAPI app factory and the one error edge of the service.

Who calls it: ``dsagent serve`` (under uvicorn, on the unix socket and optionally TCP)
and tests. :func:`create_app` injects the service and the clock; the app starts the
service (and, in cluster mode, the Kubernetes integration) on start-up and stops them on
shutdown. Every error leaves as JSON ``{"code", "message", "hint"?, "details"?}``:
deliberate errors with their ``http_status``, bad requests as 400/404/405/413, anything
unexpected as a logged 500 that leaks no internals.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dsagent import __version__
from dsagent.api.identity import own_pod_uid
from dsagent.api.routes import router
from dsagent.errors import DsagentError, InvalidInput
from dsagent.cache.service import CacheService
from dsagent.cache.settings import Settings

log = logging.getLogger("dsagent.api")


class BodyTooLarge(InvalidInput):
    http_status = 413
    code = "body_too_large"


class KubernetesUnavailable(DsagentError):
    code = "kubernetes_unavailable"
    exit_code = 2


def create_app(settings: Settings, *, service: CacheService | None = None, clock: Callable[[], float] = time.time) -> FastAPI:
    """The agent's ASGI app; ``service`` defaults to a :class:`CacheService` on ``settings``."""
    svc = service if service is not None else CacheService(settings, clock=clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cluster = load_cluster_agent(svc, settings) if settings.kubernetes else None
        await svc.start()
        try:
            if cluster is not None:
                await cluster.start()
            yield
        finally:
            if cluster is not None:
                await cluster.stop()
            await svc.stop()

    app = FastAPI(title="dsagent", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/v1/openapi.json")
    app.state.service = svc
    app.state.settings = settings
    app.state.own_pod_uid = own_pod_uid(settings.proc_root)  # kubectl exec into the agent is an operator
    app.include_router(router)
    _install_error_edge(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app


def load_cluster_agent(service: CacheService, settings: Settings) -> Any:
    """``dsagent.kube.agent.ClusterAgent(service, settings)``, imported only in cluster mode."""
    try:
        module = importlib.import_module("dsagent.kube.agent")
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("dsagent"):
            raise KubernetesUnavailable(f"cluster mode needs {exc.name!r}, which is not installed", hint="pip install dsplatform") from exc
        raise KubernetesUnavailable(
            "cluster mode (--kubernetes) is not available in this build: dsagent.kube.agent is missing",
            hint="run without --kubernetes / DSAGENT_KUBERNETES, or install a build with the Kubernetes integration",
        ) from exc
    return module.ClusterAgent(service, settings)


def _error(exc: DsagentError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.http_status)


def _install_error_edge(app: FastAPI) -> None:
    @app.exception_handler(DsagentError)
    async def deliberate(_: Request, exc: DsagentError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{"where": ".".join(str(p) for p in e.get("loc", ())), "problem": str(e.get("msg", ""))} for e in exc.errors()]
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


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` (by header, and while streaming)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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
        error = BodyTooLarge(f"request body over {self.max_bytes} bytes", hint="datasets lists are small; check what is being sent")
        await _error(error)(scope, receive, send)



__all__ = ["BodyTooLarge", "KubernetesUnavailable", "create_app", "load_cluster_agent"]
