"""The agent's thread pools: one thread for the catalog, two for request checks, a worker
pool for the rest (fetches, digests, the disk).

Who calls it: :class:`dsagent.cache.service.CacheService` creates one :class:`Pools` and hands it
to the parts it coordinates (space, versions, recovery), so every blocking call (SQLite,
fsspec, the disk) runs off the event loop through the same two doors. The catalog gets a
single thread because a SQLite connection is used from one thread at a time; it also
makes catalog calls run in the order they were made.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")


class Pools:
    """``await pools.db(fn, ...)`` for catalog calls, ``await pools.work(fn, ...)`` for the rest."""

    def __init__(self, workers: int) -> None:
        self._db_pool = ThreadPoolExecutor(1, thread_name_prefix="dsagent-catalog")
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="dsagent-fetch")
        # request checks (text and a stat inside the allowed directories) never queue
        # behind fetches: a source that hangs every worker cannot block new requests' answers
        self._check_pool = ThreadPoolExecutor(2, thread_name_prefix="dsagent-check")
        self._queued: dict[int, float] = {}  # call id -> when it was queued, until a thread takes it
        self._ids = itertools.count()
        self._lock = threading.Lock()

    async def db(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(
            self._db_pool, self._tracked(functools.partial(fn, *args, **kwargs))
        )

    async def work(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self._tracked(functools.partial(fn, *args, **kwargs))
        )

    async def check(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(
            self._check_pool, functools.partial(fn, *args, **kwargs)
        )

    def _tracked(self, call: Callable[[], _T]) -> Callable[[], _T]:
        """``call``, remembered as queued until a thread starts it (see :meth:`stalled`)."""
        key = next(self._ids)
        with self._lock:
            self._queued[key] = time.monotonic()

        def run() -> _T:
            with self._lock:
                self._queued.pop(key, None)
            return call()

        return run

    def stalled(self, after: float) -> float:
        """How long the oldest call has waited for a thread, when over ``after`` seconds
        (else 0): every thread is then stuck (a hanging source, a dead NFS server), and
        the agent is not ready, so that nothing routes new pods to it."""
        now = time.monotonic()
        with self._lock:
            oldest = min(self._queued.values(), default=now)
        waited = now - oldest
        return waited if waited > after else 0.0

    def shutdown_workers(self) -> None:
        """Drop queued calls; threads stuck in a call are left behind (the process exits
        without them: ``dsagent serve`` ends with ``os._exit``)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._check_pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._queued.clear()

    def shutdown_catalog(self) -> None:
        self._db_pool.shutdown(wait=True)


__all__ = ["Pools"]
