"""The base of the agent's ASGI middlewares: HTTP requests only, and the status each was answered with.

Who calls it: :class:`dsagent.api.timing.RouteTiming`, :class:`dsagent.api.audit.OperatorAudit`
and :class:`dsagent.api.BodyLimit` derive from :class:`HttpMiddleware`. What it owns: passing
every other scope (lifespan) through untouched, and observing the status a request was
answered with whatever the app raised (500 when it raised before answering: what the
server then sends).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HttpMiddleware:
    """An ASGI middleware of the HTTP requests :meth:`wants`; subclasses override :meth:`http`
    or, to observe the answer, :meth:`answered`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def wants(self, scope: Scope) -> bool:
        """Whether this HTTP request is the middleware's (the others go straight to the app)."""
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.wants(scope):
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One request: the app answers it, then :meth:`answered` hears how, even when the app raised."""
        started = time.perf_counter()
        status = 500  # what the server answers when the app raises before starting a response

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self.answered(scope, status, time.perf_counter() - started)

    def answered(self, scope: Scope, status: int, seconds: float) -> None:
        """A request was answered with ``status`` after ``seconds`` (to the response's last byte)."""


__all__ = ["HttpMiddleware"]
