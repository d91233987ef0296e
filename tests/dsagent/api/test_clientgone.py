"""``unless_gone``: work a request waits on, cancelled when its client goes (dsagent.api.clientgone).

The ASGI ``receive`` here is a queue of the messages a server hands a GET: its empty body,
then, when the connection closes, ``http.disconnect`` (uvicorn answers it again on every
later call). The end-to-end case, a real agent and a client that gives up, is
tests/dsagent/cache/test_stripe_release_stops_fetches.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dsagent.api.clientgone import ClientGone, unless_gone


class Connection:
    """A GET's ``receive``: its body at once, ``http.disconnect`` once :meth:`close` is called."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.sent_body = False
        self.calls = 0

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.closed.wait()
        return {"type": "http.disconnect"}

    def close(self) -> None:
        self.closed.set()


def test_work_that_ends_first_gives_its_result_and_leaves_no_watcher() -> None:
    async def run() -> None:
        connection = Connection()
        assert await unless_gone(connection.receive, asyncio.sleep(0.01, result="bundle")) == "bundle"
        await asyncio.sleep(0)
        # the watcher was cancelled: nothing waits on receive any more
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(run())


def test_a_client_that_goes_cancels_the_work_before_the_error() -> None:
    async def run() -> None:
        connection = Connection()
        ended: list[str] = []

        async def work() -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                ended.append("cancelled")
                raise
            return "late"

        asyncio.get_running_loop().call_later(0.05, connection.close)
        with pytest.raises(ClientGone, match="closed its connection"):
            await asyncio.wait_for(unless_gone(connection.receive, work()), 5)
        assert ended == ["cancelled"]  # the work had ended when the error was raised
        assert connection.calls == 2  # the body, then the disconnect

    asyncio.run(run())


def test_a_handler_cancelled_takes_its_work_with_it() -> None:
    async def run() -> None:
        connection = Connection()
        started = asyncio.Event()
        ended: list[str] = []

        async def work() -> None:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                ended.append("cancelled")
                raise

        handler = asyncio.ensure_future(unless_gone(connection.receive, work()))
        await started.wait()
        handler.cancel()  # the server stops
        with pytest.raises(asyncio.CancelledError):
            await handler
        await asyncio.sleep(0.01)
        assert ended == ["cancelled"]

    asyncio.run(run())


def test_the_work_s_own_error_reaches_the_caller() -> None:
    async def run() -> None:
        async def work() -> None:
            raise FileNotFoundError("no such bundle")

        with pytest.raises(FileNotFoundError, match="no such bundle"):
            await unless_gone(Connection().receive, work())

    asyncio.run(run())
