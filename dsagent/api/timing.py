"""Per-route latency of the agent's API: an ASGI middleware around the whole app.

Who calls it: :func:`dsagent.api.create_app` installs it outermost, so a request refused by
the body limit or the error edge is timed too. What it owns: the route label. It is the
matched route's *template* (``/v1/tasks/{task_id}``), read from the scope after the router
matched it (Starlette and FastAPI put the route there), never the raw path: a label per
task id would be a new series per pod. A path no route matches is ``unmatched``.
The time runs until the response's last byte was handed to the server (a bundle streamed
to a peer counts whole); the metric is :class:`dsagent.cache.metrics.Metrics`'s
``dsplatform_agent_http_request_duration_seconds`` (docs/design.md#metrics).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from dsagent.cache.metrics import Metrics


class RouteTiming:
    """Observe each HTTP request's seconds by method, route template and status."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app raises before starting a response

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.http_request(scope["method"], route, status, time.perf_counter() - started)


__all__ = ["RouteTiming"]
