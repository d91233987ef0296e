"""The local digest cache: re-digesting an unchanged tree costs a walk and a stat per file.

Who calls it: :func:`dsagent.format.digester.build_manifest` (and so ``dsctl digest``, the
agent's local sources) and :func:`dsagent.format.bundles.bundle.pack_dataset` (``dsctl
pack``). What it owns: one SQLite file holding, for each tree root digested, one record of
the files under it: relative path, size, mtime_ns, inode, ctime_ns and digest, as columns.
A file's recorded digest is taken while its ``(size, mtime_ns, inode, ctime_ns)`` are as
recorded. Any change to those (a rewrite, a ``touch``, a replacement by rename, even an
mtime set back by hand, which still moves ctime) makes the file miss and it is read again.

One record a tree, not a row a file: reading and writing one SQLite row a file cost about
5 us a file on one core, at every ``dsctl digest`` and ``pack`` (0.24 s of a 0.63 s pack of
50,000 files of 4 KB on tmpfs), more than hashing small files from the page cache; a
record is one read and one write of a few MB, and an unchanged tree is matched by comparing
whole columns. A digest of a directory inside a recorded tree, or of its parent, starts a
record of its own.

Racy files: a file modified within the filesystem's timestamp granularity of being hashed
could change again without its mtime moving (git's "racy clean" problem), so files whose
mtime or ctime is less than ``racy_window_ns`` before the digest started are not recorded.
Only local files are cached: object stores give no inode and coarse mtimes.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import sys
import time
from array import array
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import xxhash

from dsagent.errors import SourceUnavailable
from dsagent.format.walk import signed_inode


class _Found(Protocol):
    """What the cache needs of a file the digester found (its walk's record satisfies it)."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def inode(self) -> int: ...
    @property
    def ctime_ns(self) -> int: ...


#: One record a tree root, in parts (:func:`part_starts`). A file of an older
#: format (``PRAGMA user_version``; the row-a-file table of earlier releases has 0) is
#: emptied on open: it is only a cache. One of a newer format (a later release shares the
#: file) is left as it is, read as empty and not written.
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS trees (root TEXT NOT NULL, part INTEGER NOT NULL, record BLOB NOT NULL,"
    " PRIMARY KEY (root, part)) WITHOUT ROWID"
)
#: Files a part of a record holds at least (about 5 MB), unless it is the last: a digest
#: writes only the parts whose bytes changed, so one file changed in a tree of 14 million
#: files (ImageNet-21k's size, about 214 parts) rewrites one part, not 1.1 GB.
PART_FILES = 1 << 16
#: Files a part holds at most, whatever its directories (far under SQLite's 1 GB limit on a value)
PART_FILES_MAX = 4 * PART_FILES


def part_starts(paths: Sequence[str]) -> list[int]:
    """Where each part of a record of ``paths`` starts: a part ends at the first change of
    directory once it holds :data:`PART_FILES` files (or at :data:`PART_FILES_MAX`). Its
    ends are the tree's own, not counts: a file added to or removed from a directory
    changes its part alone, where parts cut every so many files would all shift after it."""
    starts = [0]
    count = len(paths)
    while starts[-1] + PART_FILES < count:
        end, limit = starts[-1] + PART_FILES, min(count, starts[-1] + PART_FILES_MAX)
        here = paths[end - 1].rpartition("/")[0]
        while end < limit and paths[end].rpartition("/")[0] == here:
            end += 1
        if end >= count:
            break
        starts.append(end)
    return starts


_FORMAT = 2
_OLD_TABLES = ("digests", "trees")

#: A record: magic, file count, bytes of the NUL-joined paths; then the paths, the four
#: int64 columns (sizes, mtimes, inodes, ctimes; little-endian) and 16 raw digest bytes a file.
_HEADER = struct.Struct("<8sQQ")
_MAGIC = b"dsdc\x001\x00\x00"

#: seconds a digest cache waits for another connection's lock, when opening as when writing
OPEN_WAIT_S = 30.0

Column = Sequence[int]
if TYPE_CHECKING:
    Columns = tuple[array[int], array[int], array[int], array[int]]


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for a lock another connection holds ("locked", "busy")."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _q(column: Column) -> array[int]:
    """``column`` as an int64 array (itself when it is one)."""
    return column if isinstance(column, array) and column.typecode == "q" else array("q", column)


def _q_inodes(column: Column) -> array[int]:
    """Inodes as an int64 array, as the native listing holds them (:func:`signed_inode`)."""
    return column if isinstance(column, array) and column.typecode == "q" else array("q", map(signed_inode, column))


class Snapshot:
    """What the cache recorded for one tree root when a digest started (empty when nothing,
    or a record this release cannot read). ``paths`` are relative to the root."""

    def __init__(
        self,
        root: str,
        paths: list[str] | None = None,
        columns: Columns | None = None,
        digests: bytes = b"",
        parts: Sequence[bytes] = (),
    ) -> None:
        self.root = root
        self.paths = paths if paths is not None else []
        self.sizes, self.mtimes, self.inodes, self.ctimes = columns or (array("q"),) * 4
        self.digests = digests
        #: what the record's parts hold, each part's bytes hashed: the parts a store leaves as they are
        self.parts = tuple(parts)
        self._rows: dict[str, tuple[int, int, int, int, str]] | None = None
        self._where: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def hex_digests(self) -> list[str]:
        hexed = self.digests.hex()
        return [hexed[o : o + 32] for o in range(0, len(hexed), 32)]

    def rows(self) -> dict[str, tuple[int, int, int, int, str]]:
        """``path -> (size, mtime_ns, inode, ctime_ns, hex digest)``, made once (the pure loops' lookups)."""
        if self._rows is None:
            self._rows = dict(
                zip(self.paths, zip(self.sizes, self.mtimes, self.inodes, self.ctimes, self.hex_digests()))
            )
        return self._rows

    def get(self, path: str) -> tuple[int, int, int, int, str] | None:
        return self.rows().get(path)

    def lookup(self, paths: Sequence[str], sizes: Column, mtimes: Column, inodes: Column, ctimes: Column) -> list[int]:
        """For each file of a listing (columns), the index of its unchanged record, or -1.
        A tree listed as it was recorded is matched column against column, without a loop."""
        if not self.paths:
            return [-1] * len(paths)
        mine = (self.sizes, self.mtimes, self.inodes, self.ctimes)
        theirs = (_q(sizes), _q(mtimes), _q_inodes(inodes), _q(ctimes))
        index: Sequence[int]
        if paths == self.paths:
            if mine == theirs:
                return list(range(len(paths)))
            index = range(len(paths))
        else:
            if self._where is None:
                self._where = {path: i for i, path in enumerate(self.paths)}
            where = self._where
            index = [where.get(path, -1) for path in paths]
        sizes_, mtimes_, inodes_, ctimes_ = mine
        return [
            i if i >= 0 and sizes_[i] == s and mtimes_[i] == m and inodes_[i] == n and ctimes_[i] == c else -1
            for i, s, m, n, c in zip(index, *theirs)
        ]

    def known(
        self, paths: Sequence[str], sizes: Column, mtimes: Column, inodes: Column, ctimes: Column
    ) -> list[str | None]:
        """:meth:`lookup` as each file's recorded hex digest, or None."""
        index = self.lookup(paths, sizes, mtimes, inodes, ctimes)
        if not any(i >= 0 for i in index):
            return [None] * len(index)
        hexes = self.hex_digests()
        return [hexes[i] if i >= 0 else None for i in index]


def _encode(paths: Sequence[str], columns: Sequence[array[int]], digests: bytes) -> bytes:
    names = "\0".join(paths).encode("utf-8", "surrogateescape")
    parts = [_HEADER.pack(_MAGIC, len(paths), len(names)), names]
    for column in columns:
        if sys.byteorder != "little":
            column = array("q", column)
            column.byteswap()
        parts.append(column.tobytes())
    parts.append(digests)
    return b"".join(parts)


def _decode(record: bytes) -> tuple[list[str], Columns, bytes] | None:
    """The files a part of a record holds; None for one that does not add up."""
    if len(record) < _HEADER.size:
        return None
    magic, count, length = _HEADER.unpack_from(record)
    at = _HEADER.size + length
    if magic != _MAGIC or len(record) != at + 48 * count:
        return None
    paths = record[_HEADER.size : at].decode("utf-8", "surrogateescape").split("\0") if count else []
    if len(paths) != count:
        return None
    columns = []
    for k in range(4):
        column = array("q", record[at + 8 * count * k : at + 8 * count * (k + 1)])
        if sys.byteorder != "little":
            column.byteswap()
        columns.append(column)
    return paths, (columns[0], columns[1], columns[2], columns[3]), record[at + 32 * count :]


def _part_digest(record: bytes) -> bytes:
    """What a part's bytes hash to: a part whose new bytes hash the same is not written again."""
    return xxhash.xxh3_128_digest(record)


def _joined(root: str, records: Sequence[bytes]) -> Snapshot:
    """The snapshot a record's parts hold, in order; an empty one when a part does not add up."""
    parts = [_decode(record) for record in records]
    if not parts:
        return Snapshot(root)
    hashed = [_part_digest(record) for record in records]
    if len(parts) == 1 and parts[0] is not None:
        return Snapshot(root, *parts[0], parts=hashed)
    paths: list[str] = []
    columns: Columns = (array("q"), array("q"), array("q"), array("q"))
    digests = bytearray()
    for part in parts:
        if part is None:
            return Snapshot(root)
        paths += part[0]
        for column, more in zip(columns, part[1]):
            column.extend(more)
        digests += part[2]
    return Snapshot(root, paths, columns, bytes(digests), hashed)


def _key(root: str) -> str:
    return root.rstrip("/") or "/"


class DigestCache:
    """A SQLite-backed map ``tree root -> its files' digests``, each valid while the file's
    size, mtime, inode and ctime hold."""

    def __init__(self, path: str | os.PathLike[str], *, racy_window_ns: int = 2_000_000_000) -> None:
        self.path = Path(path)
        self.racy_window_ns = racy_window_ns
        self.hits = 0
        self.misses = 0
        self._started_ns = time.time_ns()
        self._newer = False  # the file is of a later release's format (see _SCHEMA)
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
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version < _FORMAT:
                    version = self._make_table(db)
                self._newer = version > _FORMAT
                return db
            except sqlite3.OperationalError as exc:
                db.close()
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
            except BaseException:
                db.close()
                raise

    @staticmethod
    def _make_table(db: sqlite3.Connection) -> int:
        """Empty a file of an older format and make the table, in one transaction that holds
        the write lock from its start; the format found then. Made one statement at a time,
        a second connection opening the new file meanwhile dropped the table the first had
        just made, under the first's reads ("no such table")."""
        db.execute("BEGIN IMMEDIATE")  # another connection waits here (the open's timeout)
        try:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version < _FORMAT:
                for table in _OLD_TABLES:
                    db.execute(f"DROP TABLE IF EXISTS {table}")
                db.execute(_SCHEMA)
                db.execute(f"PRAGMA user_version = {_FORMAT}")
                version = _FORMAT
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return version

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> DigestCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, root: str) -> Snapshot:
        """What is recorded for the tree at ``root`` (one query); files modified from now on
        (less the racy window) will not be recorded."""
        self._started_ns = time.time_ns()
        if self._newer:
            return Snapshot(root)
        try:
            rows = self._db.execute("SELECT record FROM trees WHERE root = ? ORDER BY part", (_key(root),)).fetchall()
        except sqlite3.Error as exc:
            raise SourceUnavailable(
                f"digest cache {self.path} is unreadable: {exc}", hint="delete it; it is only a cache"
            ) from exc
        return _joined(root, [bytes(record) for (record,) in rows])

    def match(self, snapshot: Snapshot, item: _Found) -> str | None:
        """The recorded digest of ``item`` if its size, mtime, inode and ctime are unchanged."""
        row = snapshot.get(item.path)
        if row is not None and row[:4] == (item.size, item.mtime_ns, signed_inode(item.inode), item.ctime_ns):
            return row[4]
        return None

    def record(self, *, hits: int, misses: int) -> None:
        """Count one digest run's hits and misses (``match`` runs on many threads, so it does not)."""
        self.hits += hits
        self.misses += misses

    def store(
        self, snapshot: Snapshot, paths: Sequence[str], sizes: Column, mtimes: Column, inodes: Column,
        ctimes: Column, digests: bytes, *, leave_out: Collection[int] = (),
    ) -> None:  # fmt: skip
        """Record the tree of ``snapshot`` as just digested (every file, 16 raw digest bytes
        each), less its racy files and the files at the indexes ``leave_out`` (read as other
        than they were listed). Only the parts (:func:`part_starts`) whose bytes are not
        what ``snapshot`` read are written, and the parts past the new last one dropped:
        nothing is written when the tree is as recorded."""
        if self._newer:
            return
        columns = [_q(sizes), _q(mtimes), _q_inodes(inodes), _q(ctimes)]
        limit = self._started_ns - self.racy_window_ns
        racy = (
            [i for i, (m, c) in enumerate(zip(columns[1], columns[3])) if m >= limit or c >= limit]
            if paths and max(max(columns[1]), max(columns[3])) >= limit
            else []
        )
        if racy or leave_out:
            keep = sorted(set(range(len(paths))) - set(racy) - set(leave_out))
            paths = [paths[i] for i in keep]
            columns = [array("q", [column[i] for i in keep]) for column in columns]
            digests = b"".join(digests[16 * i : 16 * i + 16] for i in keep)
        if (
            paths == snapshot.paths and digests == snapshot.digests
            and columns == [snapshot.sizes, snapshot.mtimes, snapshot.inodes, snapshot.ctimes]
        ):  # fmt: skip
            return
        key = _key(snapshot.root)
        starts = part_starts(paths)
        records = [
            _encode(paths[first:end], [c[first:end] for c in columns], digests[16 * first : 16 * end])
            for first, end in zip(starts, [*starts[1:], len(paths)])
        ]
        had = snapshot.parts
        changed = [
            (key, part, record)
            for part, record in enumerate(records)
            if part >= len(had) or _part_digest(record) != had[part]
        ]
        try:
            with self._db:
                # past the new last part: what a larger tree, or a part that did not add up, left
                self._db.execute("DELETE FROM trees WHERE root = ? AND part >= ?", (key, len(records)))
                self._db.executemany("INSERT OR REPLACE INTO trees VALUES (?, ?, ?)", changed)
        except sqlite3.Error as exc:
            raise SourceUnavailable(
                f"cannot write the digest cache {self.path}: {exc}", hint="delete it; it is only a cache"
            ) from exc

    def store_found(
        self, snapshot: Snapshot, paths: Sequence[str], sizes: Column, mtimes: Column, digests: bytes,
        fresh: Sequence[_Found],
    ) -> None:  # fmt: skip
        """:meth:`store` for the pure loops, which stat only the files they hash (``fresh``):
        the others were answered by ``snapshot``, whose inodes and ctimes they keep."""
        numbers = {item.path: (signed_inode(item.inode), item.ctime_ns) for item in fresh}
        rows = snapshot.rows() if len(numbers) < len(paths) else {}
        inodes, ctimes = array("q"), array("q")
        for path in paths:
            number = numbers.get(path)
            if number is None:
                row = rows[path]
                number = (row[2], row[3])
            inodes.append(number[0])
            ctimes.append(number[1])
        self.store(snapshot, paths, sizes, mtimes, inodes, ctimes, digests)
