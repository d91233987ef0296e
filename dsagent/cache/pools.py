"""The agent's two thread pools: one thread for the catalog, a worker pool for the rest.

Who calls it: :class:`dsagent.cache.service.CacheService` creates one :class:`Pools` and hands it
to the parts it coordinates (space, versions, recovery), so every blocking call (SQLite,
fsspec, the disk) runs off the event loop through the same two doors. The catalog gets a
single thread because a SQLite connection is used from one thread at a time; it also
makes catalog calls run in the order they were made.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")


class Pools:
    """``await pools.db(fn, ...)`` for catalog calls, ``await pools.work(fn, ...)`` for the rest."""

    def __init__(self, workers: int) -> None:
        self._db_pool = ThreadPoolExecutor(1, thread_name_prefix="dsagent-catalog")
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="dsagent-fetch")

    async def db(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._db_pool, functools.partial(fn, *args, **kwargs))

    async def work(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def shutdown_workers(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)

    def shutdown_catalog(self) -> None:
        self._db_pool.shutdown(wait=True)


__all__ = ["Pools"]
