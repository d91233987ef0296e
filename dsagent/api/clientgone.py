"""Work a request waits on that only its client wants: cancelled when the client goes.

uvicorn does not cancel a request's handler when its connection closes; a handler learns of it
only from ``receive()``, which answers ``http.disconnect`` then. A handler whose answer waits on
work done for its client alone (a bundle fetched into the stripe window for one reader, a
long-poll's wait for a task or an operation) runs that work with :func:`unless_gone`: the
client that closes its connection first cancels it, so that the work stops (the window then
stops a fetch no reader waits for; a long-poll stops waiting, the task's work goes on)
instead of running to its end for nobody.

Who calls it: :mod:`dsagent.api.striperoutes` (a stripe bundle), :mod:`dsagent.api.routes`
(``?wait=`` on tasks and operations).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from dsagent.errors import TransientError

T = TypeVar("T")


class ClientGone(TransientError):
    """The client closed its connection before its answer was ready (nobody reads the answer)."""

    code = "client_gone"


async def unless_gone(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`ClientGone` once the request's client has closed its
    connection before ``work`` ended (``work`` is cancelled, and has ended, by then). For a
    request whose body is read already (a GET's is empty; a PUT's or POST's read by its
    route's parameters): what ``receive`` answers is what is left of the body, if anything,
    then, when the connection closes, ``http.disconnect``; a response streamed afterwards
    still learns of the disconnect (the server answers it again)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler cancelled (the server stops): the work goes with it
        task.cancel()
        raise
    finally:
        watch.cancel()
        if watch.done() and not watch.cancelled():
            watch.exception()  # retrieved: a receive that failed counts as the client gone
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone("the client closed its connection before its answer was ready")


async def _disconnect(receive: Receive) -> None:
    """Returns once ``receive`` answers ``http.disconnect``."""
    while (await receive())["type"] != "http.disconnect":
        pass


__all__ = ["ClientGone", "unless_gone"]
