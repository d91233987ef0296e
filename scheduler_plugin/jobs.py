"""Which RoCE class each job's workers use, remembered per job with expiry.

The first worker of a job fixes the job's class; every later worker gets the same one
so that all of them use NICs of one subnet. An entry lives ``ttl_s`` seconds after its
last use (a finished job is forgotten; a running one keeps its class while workers
arrive). The clock is injected. Called by the framework and ``GET /v1/roce-class``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class JobClasses:
    """job key ("namespace/job") -> RoCE class name, with expiry. Thread-safe."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, job: str) -> str | None:
        """The job's class, refreshing its expiry; None when unknown or expired."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(job)
            if entry is None:
                return None
            if entry[1] <= now:
                del self._entries[job]
                return None
            self._entries[job] = (entry[0], now + self.ttl_s)
            return entry[0]

    def remember(self, job: str, gpu_class: str) -> str:
        """Record the job's class unless it already has a live one; returns the class in force."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(job)
            if entry is not None and entry[1] > now:
                gpu_class = entry[0]
            self._entries[job] = (gpu_class, now + self.ttl_s)
            self._expire(now)
            return gpu_class

    def _expire(self, now: float) -> None:
        if len(self._entries) < 1024:
            return
        for job in [j for j, (_, until) in self._entries.items() if until <= now]:
            del self._entries[job]

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["JobClasses"]
