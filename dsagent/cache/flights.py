"""Single-flight: concurrent callers with the same key share one running coroutine.

Who calls it: :class:`dsagent.cache.service.CacheService` (one ``("resolve", name, source,
bundles)`` flight per consistency check, one ``("fetch", name, digest)`` flight per
version being fetched); :mod:`dsagent.cache.space` and :mod:`dsagent.cache.versions` ask it which
versions are being fetched (those are never evicted).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dsagent.cache.layout import Key

_T = TypeVar("_T")


class Flights:
    """The coroutines in flight, by key; a waiter giving up never cancels a flight."""

    def __init__(self) -> None:
        self._running: dict[tuple[Any, ...], asyncio.Future[Any]] = {}

    async def join(self, key: tuple[Any, ...], start: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """``await start(*args)``, unless a flight under ``key`` is running: then its result."""
        flight = self._running.get(key)
        if flight is None or flight.done():  # a landed flight settled its waiters already
            flight = asyncio.ensure_future(start(*args))
            self._running[key] = flight
            flight.add_done_callback(functools.partial(self._landed, key))
        result: _T = await asyncio.shield(flight)
        return result

    def _landed(self, key: tuple[Any, ...], flight: asyncio.Future[Any]) -> None:
        if self._running.get(key) is flight:
            del self._running[key]
        if not flight.cancelled():
            flight.exception()  # retrieved here: every waiter sees it; asyncio must not warn

    def fetching(self) -> set[Key]:
        """The versions being fetched now."""
        return {(key[1], key[2]) for key in self._running if key[0] == "fetch"}

    def is_fetching(self, key: Key) -> bool:
        return ("fetch", *key) in self._running

    def futures(self) -> list[asyncio.Future[Any]]:
        return list(self._running.values())


__all__ = ["Flights"]
