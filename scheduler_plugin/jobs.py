"""Which RoCE class each job's workers use, remembered per job with expiry.

The first worker of a job fixes the job's class; every later worker gets the same one
so that all of them use NICs of one subnet. An entry lives ``ttl_s`` seconds after its
last use (a finished job is forgotten; a running one keeps its class while workers
arrive). The clock is injected. Called by the framework and ``GET /v1/roce-class``.

The expiring map is ``cachetools.TTLCache`` (it replaced a hand-written dict of
``(class, deadline)`` with its own sweep); re-assigning an entry on every use restarts its
TTL. ``maxsize`` bounds memory: past it the least recently used job is dropped, which
only costs that job a fresh class choice for its next worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cachetools import TTLCache

MAX_JOBS = 65536


class JobClasses:
    """job key ("namespace/job") -> RoCE class name, with expiry. Thread-safe."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic, *, maxsize: int = MAX_JOBS) -> None:
        self.ttl_s = ttl_s
        self._entries: TTLCache[str, str] = TTLCache(maxsize=maxsize, ttl=ttl_s, timer=clock)
        self._lock = threading.Lock()  # TTLCache is not thread-safe

    def get(self, job: str) -> str | None:
        """The job's class, refreshing its expiry; None when unknown or expired."""
        with self._lock:
            gpu_class = self._entries.get(job)
            if gpu_class is not None:
                self._entries[job] = gpu_class  # restarts the TTL
            return gpu_class

    def remember(self, job: str, gpu_class: str) -> str:
        """Record the job's class unless it already has a live one; returns the class in force."""
        with self._lock:
            gpu_class = self._entries.get(job, gpu_class)
            self._entries[job] = gpu_class
            return gpu_class

    def __len__(self) -> int:
        with self._lock:
            self._entries.expire()
            return len(self._entries)


__all__ = ["JobClasses"]
