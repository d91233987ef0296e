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

from typing import TYPE_CHECKING

from dsagent.api.middleware import HttpMiddleware

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Scope

    from dsagent.cache.metrics import Metrics


class RouteTiming(HttpMiddleware):
    """Observe each HTTP request's seconds by method, route template and status."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    def answered(self, scope: Scope, status: int, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        self.metrics.http_request(scope["method"], route, status, seconds)


__all__ = ["RouteTiming"]
