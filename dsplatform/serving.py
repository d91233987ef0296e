"""What every HTTP process does around its server: bind first, and a failed start is an error.

Who calls it: ``dsagent serve`` (``dsagent.nodeagent.serve``, its TCP listener), the extender
(``scheduler_plugin.__main__``) and the webhook (``dsagent.webhook.server``). What
it owns, once for all three (this package imports no web server, so the server itself is
each caller's):

- :func:`listening_socket`: the TCP socket bound and listening before the server starts,
  so a busy or forbidden address is one line and exit 2 (:class:`CannotListen`) instead of
  uvicorn's log and an exit code that means something else;
- :class:`StartupWatch`: wraps the ASGI app and keeps the exception its lifespan start-up
  raised. uvicorn logs such an error and ends with ``SystemExit(3)`` (or returns, in other
  releases), so every process exited 3, ``not_found``'s code. :meth:`StartupWatch.serving`
  turns that into the error to raise at the process edge: the start-up's own error when it
  is one of ours (a wrong node name: exit 2), else a
  :class:`~dsplatform.errors.PlatformError` (exit 1, an unexpected error, whose traceback
  uvicorn has logged).
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dsplatform.errors import InvalidInput, PlatformError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
BACKLOG = 128


class CannotListen(InvalidInput):
    """The listening address is busy, forbidden or not this host's: a setting to change."""

    code = "invalid_setting"


def listening_socket(host: str, port: int, *, hint: str) -> socket.socket:
    """A TCP socket on ``host:port`` (IPv6 when the host has a colon), listening and
    inheritable, whose connections send without Nagle's delay; :class:`CannotListen` with
    ``hint`` (the flag or variable to change) when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only
    # on sockets whose ``proto`` says TCP, and accepted sockets copy it from this one. With
    # proto 0 every keep-alive reply (headers, then the body, in two writes) waited for the
    # client's delayed ACK: ~40 ms a request on Linux, whatever the server's own time.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets on Linux
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint=hint) from None
    sock.set_inheritable(True)
    return sock


class StartupWatch:
    """An ASGI app that passes everything to ``app`` and keeps the exception raised during
    its lifespan start-up (not the shut-down's: the start-up is over once the app says so)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.error: BaseException | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "lifespan":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message.get("type") == "lifespan.startup.complete"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except BaseException as exc:
            if not started:
                self.error = exc
            raise

    @contextmanager
    def serving(self, what: str, started: Callable[[], bool]) -> Iterator[None]:
        """Around the server's run: a start that failed (``started()`` false when it ends,
        or its ``SystemExit``) leaves as :meth:`failure`, the process edge's to report."""
        try:
            yield
        except SystemExit:
            if started():
                raise
            raise self.failure(what) from None
        if not started():
            raise self.failure(what)

    def failure(self, what: str) -> PlatformError:
        """The error a server that did not start ends the process with (see the module docstring)."""
        if isinstance(self.error, PlatformError):
            return self.error
        if self.error is not None:
            return PlatformError(f"{what} could not start: {type(self.error).__name__}: {self.error}")
        return PlatformError(f"{what} could not start (the server's log says why)")


def unix_socket_answers(path: str | Path, timeout: float = 1.0) -> bool:
    """Whether a process accepts connections on the unix socket ``path`` (a socket file left
    by a stopped process does not)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


__all__ = ["BACKLOG", "CannotListen", "StartupWatch", "listening_socket", "unix_socket_answers"]
