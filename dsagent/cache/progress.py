"""Progress of the fetches in flight, by version, for the task and dataset reports.

Who calls it: :mod:`dsagent.cache.versions` starts and ends an entry around each fetch (and
around each per-file copy whose digest is not known yet, found by name and source);
:mod:`dsagent.cache.service` reads them for ``GET /v1/tasks`` and ``GET /v1/datasets``;
:mod:`dsagent.cache.space` reads the bytes already written, which the disk's free space
counts already, so a reservation only holds back what is still to come.
The counters themselves are :class:`dsagent.cache.fetch.Progress` (updated from worker threads).
"""

from __future__ import annotations

from dsagent.cache.fetch import Progress

Key = tuple[str, str]  # (dataset name, version digest, or "pending-<token>" while unknown)


class ProgressBoard:
    """One :class:`Progress` per fetch in flight."""

    def __init__(self) -> None:
        self._by_key: dict[Key, Progress] = {}
        self._pending: dict[tuple[str, str], Progress] = {}  # (name, source) -> copy with digest unknown

    def start(self, key: Key, total_bytes: int, total_files: int) -> Progress:
        progress = self._by_key[key] = Progress(total_bytes, total_files)
        return progress

    def start_pending(self, key: Key, source: str, total_bytes: int, total_files: int) -> Progress:
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

    def get(self, key: Key) -> Progress | None:
        return self._by_key.get(key)

    def pending(self, name: str, source: str) -> Progress | None:
        return self._pending.get((name, source))

    def bytes_done(self, key: Key) -> int:
        progress = self._by_key.get(key)
        return progress.bytes_done if progress else 0


__all__ = ["ProgressBoard"]
