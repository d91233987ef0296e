"""FetchProgress of the fetches in flight, by version, for the task and dataset reports.

Who calls it: :mod:`dsagent.cache.versions` starts and ends an entry around each fetch (and
around each per-file copy whose digest is not known yet, found by name and source);
:mod:`dsagent.cache.service` reads them for ``GET /v1/tasks`` and ``GET /v1/datasets``;
:mod:`dsagent.cache.space` reads the bytes already written, which the disk's free space
counts already, so a reservation only holds back what is still to come.
The counters themselves are :class:`FetchProgress` (updated from worker threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dsagent.cache.layout import Key


class FetchProgress:
    """Bytes and files done of one fetch's totals; updated from worker threads, read by the API.

    Calling it is :meth:`add`, so it *is* the format library's progress callback
    (:data:`dsagent.format.manifest.Progress`): one progress type from the format to the API.
    """

    def __init__(self, total_bytes: int, total_files: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_bytes = total_bytes
        self.total_files = total_files
        self.bytes_done = 0
        self.files_done = 0
        self._clock = clock
        self._started = clock()
        self._base_bytes = 0  # bytes skipped on resume do not count towards the rate
        self._lock = threading.Lock()

    def add(self, nbytes: int, nfiles: int = 0) -> None:
        with self._lock:
            self.bytes_done += nbytes
            self.files_done += nfiles

    __call__ = add

    def skip(self, nbytes: int, nfiles: int) -> None:
        """Count work found done already (resumed bundles)."""
        with self._lock:
            self.bytes_done += nbytes
            self.files_done += nfiles
            self._base_bytes += nbytes

    def rate(self) -> float:
        elapsed = max(self._clock() - self._started, 1e-6)
        return (self.bytes_done - self._base_bytes) / elapsed

    def eta(self) -> float | None:
        rate = self.rate()
        remaining = self.total_bytes - self.bytes_done
        if remaining <= 0:
            return 0.0
        return remaining / rate if rate > 0 else None


class ProgressBoard:
    """One :class:`FetchProgress` per fetch in flight."""

    def __init__(self) -> None:
        self._by_key: dict[Key, FetchProgress] = {}
        self._pending: dict[tuple[str, str], FetchProgress] = {}  # (name, source) -> copy with digest unknown

    def start(self, key: Key, total_bytes: int, total_files: int) -> FetchProgress:
        progress = self._by_key[key] = FetchProgress(total_bytes, total_files)
        return progress

    def start_pending(self, key: Key, source: str, total_bytes: int, total_files: int) -> FetchProgress:
        """A per-file copy of ``source`` whose digest is known only once it is done."""
        progress = self._pending[(key[0], source)] = self.start(key, total_bytes, total_files)
        return progress

    def rename(self, old: Key, new: Key) -> None:
        """The copy under ``old`` now has its version's key."""
        if old in self._by_key:
            self._by_key[new] = self._by_key.pop(old)

    def end(self, key: Key, source: str | None = None) -> None:
        self._by_key.pop(key, None)
        if source is not None:
            self._pending.pop((key[0], source), None)

    def get(self, key: Key) -> FetchProgress | None:
        return self._by_key.get(key)

    def pending(self, name: str, source: str) -> FetchProgress | None:
        return self._pending.get((name, source))

    def bytes_done(self, key: Key) -> int:
        progress = self._by_key.get(key)
        return progress.bytes_done if progress else 0


__all__ = ["FetchProgress", "ProgressBoard"]
