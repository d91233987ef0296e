"""Bind first, and a server that fails to start ends with its error's exit code
(dsplatform.serving), driven through a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import uvicorn

from dsplatform.errors import InvalidInput, PlatformError
from dsplatform.serving import CannotListen, StartupWatch, listening_socket


class WrongNodeName(InvalidInput):
    code = "invalid_input"


class Lifespan:
    """A bare ASGI app whose lifespan start-up (or shut-down) raises ``error``."""

    def __init__(self, error: BaseException | None, *, on: str = "startup") -> None:
        self.error, self.on = error, on

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self.error is not None and self.on == "startup":
                    raise self.error
                await send({"type": "lifespan.startup.complete"})
            else:
                if self.error is not None and self.on == "shutdown":
                    raise self.error
                await send({"type": "lifespan.shutdown.complete"})
                return


def serve(app: StartupWatch) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="critical"))
    server.should_exit = True  # start, then stop at once: only the start-up matters here
    with listening_socket("127.0.0.1", 0, hint="-") as sock, app.serving("the test server", lambda: server.started):
        server.run(sockets=[sock])
    return server


def test_a_busy_address_is_one_settings_error_with_the_hint() -> None:
    first = listening_socket("127.0.0.1", 0, hint="unused")
    try:
        port = first.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens: a connection is accepted into the backlog
        with pytest.raises(CannotListen) as caught:
            listening_socket("127.0.0.1", port, hint="choose another --port")
    finally:
        first.close()
    assert caught.value.exit_code == 2 and caught.value.code == "invalid_setting"
    assert str(caught.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use (choose another --port)"


def test_a_start_up_that_raises_our_error_ends_with_that_error() -> None:
    """uvicorn logs it and exits 3, not_found's code; the process edge now gets the error (exit 2)."""
    with pytest.raises(WrongNodeName, match="no node gpu-7"):
        serve(StartupWatch(Lifespan(WrongNodeName("no node gpu-7"))))


def test_a_start_up_that_raises_anything_else_is_an_internal_error() -> None:
    with pytest.raises(PlatformError) as caught:
        serve(StartupWatch(Lifespan(KeyError("catalog"))))
    assert type(caught.value) is PlatformError and caught.value.exit_code == 1
    assert str(caught.value) == "the test server could not start: KeyError: 'catalog'"


def test_a_server_that_started_is_no_failure_even_when_its_shutdown_raises() -> None:
    app = StartupWatch(Lifespan(None))
    assert serve(app).started and app.error is None
    app = StartupWatch(Lifespan(RuntimeError("on the way out"), on="shutdown"))
    assert serve(app).started and app.error is None


def test_accepted_connections_send_without_nagles_delay() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose proto is TCP: without it a keep-alive
    reply written as headers then body waited ~40 ms for the client's delayed ACK."""
    import asyncio

    seen: list[int] = []

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        with listening_socket("127.0.0.1", 0, hint="-") as sock:
            assert sock.proto == socket.IPPROTO_TCP
            server = await asyncio.start_server(handle, sock=sock)
            async with server:
                _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
                for _ in range(100):
                    if seen:
                        break
                    await asyncio.sleep(0.01)
                writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0
