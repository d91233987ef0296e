"""A per-replica cache of each job's RoCE class, for pods that do not carry one.

The job's class is decided once, when its first worker is admitted: the admission
webhook stores it in a ``coordination.k8s.io/v1`` Lease per job and rewrites every
worker's ``nvidia.com/gpu`` into the class resource (``dsagent.io/gpu-roce<N>``), which
the extender then reads from the pod itself (``docs/design.md#roce-class-choice``). This
cache only serves clusters that run without that rewrite (no class device plugin): the
first worker the extender sees fixes the job's class as a scoring preference, and later
workers get the same one while the entry lives, ``ttl_s`` seconds after its last use.
A class a pod requests as a resource replaces the cached one (it is the Lease's verdict).
The clock is injected. Called by the framework and
``GET /v1/roce-class``.

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
            found = self._entries.get(job)
            if found is not None:
                self._entries[job] = found  # a use extends the entry's life
            return found

    def remember(self, job: str, gpu_class: str) -> str:
        """Record the job's class unless it already has a live one; returns the class in force."""
        with self._lock:
            found = self._entries.get(job)
            chosen = found if found is not None else gpu_class
            self._entries[job] = chosen
            return chosen

    def set(self, job: str, gpu_class: str) -> None:
        """Record the job's class, replacing a cached one (a pod's class resource decides)."""
        with self._lock:
            self._entries[job] = gpu_class

    def forget(self, job: str) -> None:
        """Drop the job's entry (a job none of whose workers was placed chooses afresh)."""
        with self._lock:
            self._entries.pop(job, None)

    def __len__(self) -> int:
        with self._lock:
            self._entries.expire()
            return len(self._entries)


__all__ = ["JobClasses"]
