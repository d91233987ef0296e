"""The local digest cache: re-digesting an unchanged tree costs a walk and a stat per file.

Who calls it: :func:`dsagent.format.digester.build_manifest` (and so ``dsctl digest / pack``).
What it owns: one SQLite file mapping a local file's absolute path to the digest it had
when its ``(size, mtime_ns, inode, ctime_ns)`` were as recorded. Any change to those
(a rewrite, a ``touch``, a replacement by rename, even an mtime set back by hand, which
still moves ctime) makes the entry miss and the file is read again.

Racy files: a file modified within the filesystem's timestamp granularity of being hashed
could change again without its mtime moving (git's "racy clean" problem), so files whose
mtime is less than ``racy_window_ns`` before the hashing started are not cached.
Only local files are cached: object stores give no inode and coarse mtimes.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from dsagent.errors import SourceUnavailable


class _Found(Protocol):
    """What the cache needs of a file the digester found (its walk's record satisfies it)."""

    @property
    def location(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def inode(self) -> int: ...
    @property
    def ctime_ns(self) -> int: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS digests (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    digest TEXT NOT NULL
) WITHOUT ROWID
"""


#: seconds a digest cache waits for another connection's lock, when opening as when writing
OPEN_WAIT_S = 30.0


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for a lock another connection holds ("locked", "busy")."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class DigestCache:
    """A SQLite-backed map ``path -> digest`` valid while size, mtime, inode and ctime hold."""

    def __init__(self, path: str | os.PathLike[str], *, racy_window_ns: int = 2_000_000_000) -> None:
        self.path = Path(path)
        self.racy_window_ns = racy_window_ns
        self.hits = 0
        self.misses = 0
        self._started_ns = time.time_ns()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._open()
        except (sqlite3.Error, OSError) as exc:
            raise SourceUnavailable(
                f"cannot open the digest cache {self.path}: {exc}", hint="pass --no-digest-cache or fix the path"
            ) from exc

    def _open(self) -> sqlite3.Connection:
        """The connection, in WAL mode with the table made. Two processes or threads opening a
        new cache at once both ask SQLite to leave the rollback journal for WAL; SQLite then
        answers one of them "database is locked" at once, without waiting (the two would
        otherwise wait on each other). That one opens again, within the same bound as any
        lock wait (:data:`OPEN_WAIT_S`), and finds the file in WAL mode already."""
        deadline = time.monotonic() + OPEN_WAIT_S
        while True:
            db = sqlite3.connect(self.path, timeout=OPEN_WAIT_S, check_same_thread=False)
            try:
                if str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                    db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(_SCHEMA)
                return db
            except sqlite3.OperationalError as exc:
                db.close()
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
            except BaseException:
                db.close()
                raise

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> DigestCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, prefix: str) -> dict[str, tuple[int, int, int, int, str]]:
        """Every recorded file under ``prefix`` (one range query): ``path -> (size, mtime, inode, ctime, digest)``."""
        self._started_ns = time.time_ns()
        try:
            rows = self._db.execute(
                "SELECT path, size, mtime_ns, inode, ctime_ns, digest FROM digests WHERE path >= ? AND path < ?",
                (prefix, prefix + "\U0010ffff"),
            ).fetchall()
        except sqlite3.Error as exc:
            raise SourceUnavailable(
                f"digest cache {self.path} is unreadable: {exc}", hint="delete it; it is only a cache"
            ) from exc
        return {
            path: (size, mtime_ns, inode, ctime_ns, digest) for path, size, mtime_ns, inode, ctime_ns, digest in rows
        }

    def match(self, snapshot: dict[str, tuple[int, int, int, int, str]], item: _Found) -> str | None:
        """The recorded digest of ``item`` if its size, mtime, inode and ctime are unchanged."""
        row = snapshot.get(item.location)
        if row is not None and row[:4] == (item.size, item.mtime_ns, item.inode, item.ctime_ns):
            return row[4]
        return None

    def record(self, *, hits: int, misses: int) -> None:
        """Count one digest run's hits and misses (``match`` runs on many threads, so it does not)."""
        self.hits += hits
        self.misses += misses

    def store(self, digested: Iterable[tuple[_Found, str]]) -> None:
        """Record fresh digests, except for files too recently modified to trust (racy)."""
        limit = self._started_ns - self.racy_window_ns
        rows = [
            (item.location, item.size, item.mtime_ns, item.inode, item.ctime_ns, digest)
            for item, digest in digested
            if item.mtime_ns < limit and item.ctime_ns < limit
        ]
        try:
            with self._db:
                self._db.executemany("INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?, ?, ?)", rows)
        except sqlite3.Error as exc:
            raise SourceUnavailable(
                f"cannot write the digest cache {self.path}: {exc}", hint="delete it; it is only a cache"
            ) from exc
