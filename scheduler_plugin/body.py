"""Request bodies, received into memory kept from earlier requests.

A 5,000-node ``Nodes`` request is ~48 MiB. Joining the chunks the server delivers into
a fresh ``bytes`` makes the kernel map and zero 48 MiB of new pages on every request
(about 25 ms on a VM, as much as the extender's own work on that request); writing them
into a ``bytearray`` kept from the previous request touches pages already mapped (about
4 ms). A buffer is lent to one request at a time and taken back after its reply, and
only when nothing still views it (a ``memoryview`` into it would see the next request's
bytes); at most ``keep`` buffers are kept, so idle memory is bounded by the largest
requests seen. Called by :mod:`scheduler_plugin.app`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class BodyBuffers:
    """Receives ASGI request bodies into reused ``bytearray`` buffers."""

    def __init__(self, limit: int, *, keep: int = 2) -> None:
        self.limit = limit
        self.keep = keep
        self._free: list[bytearray] = []

    async def read(self, receive: Receive) -> bytearray | None:
        """The whole body (exactly its length), or None when it is larger than ``limit``
        (the rest is still drained from the connection)."""
        buffer = self._free.pop() if self._free else bytearray()
        size = 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            if size + len(chunk) <= self.limit:
                # Overwrites the previous request's bytes in place; grows past the end.
                buffer[size : size + len(chunk)] = chunk
            size += len(chunk)
            if not message.get("more_body", False):
                break
        if size > self.limit:
            self.give_back(buffer)
            return None
        del buffer[size:]  # in place unless far smaller than before
        return buffer

    def give_back(self, buffer: bytearray) -> None:
        """Keep ``buffer`` for a later request, unless something still views it."""
        if len(self._free) >= self.keep:
            return
        try:
            buffer.append(0)  # raises BufferError while a memoryview of it is alive
        except BufferError:
            return
        buffer.pop()
        self._free.append(buffer)


__all__ = ["BodyBuffers"]
