"""The agent's durable state: a SQLite catalog (WAL mode) under the cache root.

Who calls it: the service's parts (:mod:`dsagent.cache.service`, :mod:`dsagent.cache.space`,
:mod:`dsagent.cache.versions`, :mod:`dsagent.cache.recovery`), always through the one catalog thread
of :mod:`dsagent.cache.pools` (the methods are synchronous and short; they run off the event
loop, in the order they were called).
What it owns: dataset versions (``name``, ``digest``, state, sizes, last use), the bundles
of a fetch already verified (so a restarted fetch skips them), and tasks with the
datasets they hold and their leases. Storage options (credentials) are never stored here.

Every change is one transaction; ``sqlite3.Error`` is translated to :class:`CatalogError`
where it enters. A version is ``ready`` only after its directory was renamed into place,
so a catalog row never claims a partial dataset.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsagent.errors import DsagentError, InsufficientSpace, is_full_disk

SCHEMA_VERSION = 2  # 2: the namespace a task acts for, and which namespaces asked for each source
_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL, digest TEXT NOT NULL, state TEXT NOT NULL,
    size_bytes INTEGER NOT NULL, files INTEGER NOT NULL,
    source TEXT NOT NULL, bundles TEXT,
    created_at REAL NOT NULL, ready_at REAL, last_used REAL, error TEXT,
    resolved_at REAL NOT NULL,  -- when a consistency check last named this version current
    PRIMARY KEY (name, digest));
CREATE TABLE IF NOT EXISTS bundles_done (
    name TEXT NOT NULL, digest TEXT NOT NULL, bundle TEXT NOT NULL,
    PRIMARY KEY (name, digest, bundle));
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, created_at REAL NOT NULL, lease_until REAL NOT NULL,
    request TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS task_datasets (
    task_id TEXT NOT NULL REFERENCES tasks(task_id) ON DELETE CASCADE,
    name TEXT NOT NULL, digest TEXT,
    PRIMARY KEY (task_id, name));
CREATE INDEX IF NOT EXISTS task_datasets_version ON task_datasets (name, digest);
CREATE TABLE IF NOT EXISTS task_tenants (
    task_id TEXT PRIMARY KEY REFERENCES tasks(task_id) ON DELETE CASCADE,
    namespace TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenant_sources (
    name TEXT NOT NULL, source TEXT NOT NULL, namespace TEXT NOT NULL,
    PRIMARY KEY (name, source, namespace));
"""


class CatalogError(DsagentError):
    code = "catalog"


class CatalogDamaged(CatalogError):
    """The catalog file is not a readable SQLite database (a damaged header, a malformed
    page): :func:`dsagent.cache.recovery.open_catalog` keeps it aside and rebuilds."""


#: SQLite's result codes for a damaged database file: SQLITE_CORRUPT, SQLITE_NOTADB
_DAMAGED = (11, 26)


def _damaged(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _DAMAGED or any(
        words in str(exc) for words in ("file is not a database", "malformed")
    )


@dataclass(frozen=True)
class VersionRow:
    name: str
    digest: str
    state: str  # fetching | ready | failed
    size_bytes: int
    files: int
    source: str
    bundles: str | None
    created_at: float
    ready_at: float | None
    last_used: float | None
    error: str | None
    resolved_at: float


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    created_at: float
    lease_until: float
    request: list[dict[str, Any]]  # redacted dataset requests, in request order
    digests: dict[str, str | None]  # dataset name -> version digest bound to the task


#: Disk the catalog keeps in reserve beside itself: given back when a write finds the disk
#: full, so that the agent can still open its catalog, record failures and evict (without it,
#: a full disk would make every later request a 500 and the next start impossible).
BALLAST_BYTES = 4 << 20


def _disk_full(exc: BaseException, where: Path) -> bool:
    """Whether ``exc`` came from a full disk: SQLITE_FULL, ENOSPC, or an I/O error (SQLite
    reports a failed ``-shm`` extension so) while the disk has no room left."""
    if isinstance(exc, OSError):
        return is_full_disk(exc)
    if getattr(exc, "sqlite_errorcode", None) == 13 or "disk is full" in str(exc):
        return True
    try:
        return shutil.disk_usage(where).free < BALLAST_BYTES
    except OSError:
        return False


class Catalog:
    """One SQLite connection; not thread-safe, use it from a single thread."""

    def __init__(self, path: Path) -> None:
        self._ballast = path.with_name(path.name + ".ballast")
        try:
            self._open(path)
        except sqlite3.Error as exc:
            if _damaged(exc):
                with contextlib.suppress(sqlite3.Error, AttributeError):
                    self._db.close()
                raise CatalogDamaged(
                    f"the catalog at {path} is damaged: {exc}", hint="the agent keeps it aside and rebuilds it"
                ) from exc
            if not (_disk_full(exc, path.parent) and self._give_back_ballast()):
                raise CatalogError(
                    f"cannot open the catalog at {path}: {exc}", hint="check the cache root's permissions and disk"
                ) from exc
            try:
                self._open(path)
            except sqlite3.Error as again:
                raise CatalogError(
                    f"cannot open the catalog at {path}: {again}", hint="check the cache root's permissions and disk"
                ) from again
        self.keep_ballast()

    def _open(self, path: Path) -> None:
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a ready row must survive power loss
        self._db.execute("PRAGMA foreign_keys=ON")
        # damage past the header (a torn page) shows here, at start, not in a later request
        # (docs/design.md#catalog-rebuild); it reads the whole file, a few MB at most
        check = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {check}")
        if (
            self._db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION
        ):  # no write at all on a known catalog
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def keep_ballast(self) -> None:
        """(Re)create the reserve beside the catalog when the disk has room for it."""
        if self._ballast.exists():
            return
        try:
            with open(self._ballast, "wb") as out:
                os.posix_fallocate(out.fileno(), 0, BALLAST_BYTES)
        except OSError:
            self._ballast.unlink(missing_ok=True)

    def _give_back_ballast(self) -> bool:
        try:
            self._ballast.unlink()
            return True
        except OSError:
            return False

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if _disk_full(exc, self._ballast.parent):
                self._give_back_ballast()  # the next write (a retry, an eviction) has room
                raise InsufficientSpace(
                    f"catalog write failed: the cache disk is full ({exc})",
                    hint="evict unused datasets (dsctl evict) or free space",
                ) from exc
            raise CatalogError(f"catalog write failed: {exc}") from exc

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise CatalogError(f"catalog read failed: {exc}") from exc

    # -- versions ---------------------------------------------------------------------

    def versions(self, name: str | None = None) -> list[VersionRow]:
        if name is None:
            rows = self._query("SELECT * FROM versions ORDER BY name, resolved_at")
        else:
            rows = self._query("SELECT * FROM versions WHERE name = ? ORDER BY resolved_at", (name,))
        return [VersionRow(**dict(row)) for row in rows]

    def version(self, name: str, digest: str) -> VersionRow | None:
        rows = self._query("SELECT * FROM versions WHERE name = ? AND digest = ?", (name, digest))
        return VersionRow(**dict(rows[0])) if rows else None

    def begin_version(
        self, name: str, digest: str, *, size_bytes: int, files: int, source: str, bundles: str | None, now: float
    ) -> None:
        """Record a fetch starting (or restarting after a failure or crash)."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO versions (name, digest, state, size_bytes, files, source, bundles, created_at, last_used,"
                " resolved_at)"
                " VALUES (?, ?, 'fetching', ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name, digest) DO UPDATE SET state = 'fetching', error = NULL,"
                " source = excluded.source, bundles = excluded.bundles, resolved_at = excluded.resolved_at",
                (name, digest, size_bytes, files, source, bundles, now, now, now),
            )

    def adopt_ready(self, name: str, digest: str, *, size_bytes: int, files: int, now: float) -> None:
        """Record a ready version found on disk and verified against its stored manifest
        (a catalog rebuilt after damage: its source is not known until it is asked again)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO versions (name, digest, state, size_bytes, files, source, bundles, created_at,"
                " ready_at, last_used, resolved_at) VALUES (?, ?, 'ready', ?, ?, '', NULL, ?, ?, ?, ?)",
                (name, digest, size_bytes, files, now, now, now, now),
            )

    def mark_ready(self, name: str, digest: str, *, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE versions SET state = 'ready', ready_at = ?, last_used = ?, error = NULL"
                " WHERE name = ? AND digest = ?",
                (now, now, name, digest),
            )
            db.execute("DELETE FROM bundles_done WHERE name = ? AND digest = ?", (name, digest))

    def mark_failed(self, name: str, digest: str, error: str) -> None:
        """A fetch failed and keeps its staging (resumable): its bundle records stay with it."""
        with self._tx() as db:
            db.execute(
                "UPDATE versions SET state = 'failed', error = ? WHERE name = ? AND digest = ?", (error, name, digest)
            )

    def abandon(self, name: str, digest: str, error: str) -> None:
        """A fetch failed and its staging is about to be removed: the failure and the end of
        every "bundle done" record of the version in one transaction, committed before the
        directory goes (docs/design.md#ready-invariant: a record never outlives its files)."""
        with self._tx() as db:
            db.execute("DELETE FROM bundles_done WHERE name = ? AND digest = ?", (name, digest))
            db.execute(
                "UPDATE versions SET state = 'failed', error = ? WHERE name = ? AND digest = ?", (error, name, digest)
            )

    def forget_bundles(self, name: str, digest: str, bundles: Sequence[str] | None = None) -> None:
        """Drop "bundle done" records whose files are not on disk (``bundles``; all by default)."""
        with self._tx() as db:
            if bundles is None:
                db.execute("DELETE FROM bundles_done WHERE name = ? AND digest = ?", (name, digest))
            else:
                db.executemany(
                    "DELETE FROM bundles_done WHERE name = ? AND digest = ? AND bundle = ?",
                    [(name, digest, b) for b in bundles],
                )

    def with_bundles_done(self) -> set[tuple[str, str]]:
        """``(name, digest)`` of every version that has "bundle done" records."""
        return {(r["name"], r["digest"]) for r in self._query("SELECT DISTINCT name, digest FROM bundles_done")}

    def touch(self, name: str, digest: str, now: float) -> None:
        """A hit: the version is used now and is its name's current version."""
        with self._tx() as db:
            db.execute(
                "UPDATE versions SET last_used = ?, resolved_at = ? WHERE name = ? AND digest = ?",
                (now, now, name, digest),
            )

    def touch_task(self, task_id: str, now: float) -> None:
        """Mark every version a task holds as used now (on renewal and on release)."""
        with self._tx() as db:
            db.execute(
                "UPDATE versions SET last_used = ? WHERE (name, digest) IN"
                " (SELECT name, digest FROM task_datasets WHERE task_id = ? AND digest IS NOT NULL)",
                (now, task_id),
            )

    def delete_version(self, name: str, digest: str, *, unless_in_use_at: float | None = None) -> bool:
        """Forget a version; with ``unless_in_use_at``, only if no task whose lease is live
        at that time is bound to it (checked in the same transaction, so an eviction
        chosen earlier can never delete a version a task has been bound to since)."""
        with self._tx() as db:
            if (
                unless_in_use_at is not None
                and db.execute(
                    "SELECT 1 FROM task_datasets d JOIN tasks t USING (task_id)"
                    " WHERE d.name = ? AND d.digest = ? AND t.lease_until > ? LIMIT 1",
                    (name, digest, unless_in_use_at),
                ).fetchone()
            ):
                return False
            deleted = db.execute("DELETE FROM versions WHERE name = ? AND digest = ?", (name, digest)).rowcount > 0
            db.execute("DELETE FROM bundles_done WHERE name = ? AND digest = ?", (name, digest))
            return deleted

    def bundle_done(self, name: str, digest: str, bundle: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO bundles_done VALUES (?, ?, ?)", (name, digest, bundle))

    def bundles_done(self, name: str, digest: str) -> set[str]:
        rows = self._query("SELECT bundle FROM bundles_done WHERE name = ? AND digest = ?", (name, digest))
        return {row["bundle"] for row in rows}

    # -- tasks ------------------------------------------------------------------------

    def task(self, task_id: str) -> TaskRow | None:
        rows = self._query("SELECT * FROM tasks WHERE task_id = ?", (task_id,))
        if not rows:
            return None
        bound = self._query("SELECT name, digest FROM task_datasets WHERE task_id = ?", (task_id,))
        row = rows[0]
        return TaskRow(
            row["task_id"],
            row["created_at"],
            row["lease_until"],
            json.loads(row["request"]),
            {b["name"]: b["digest"] for b in bound},
        )

    def task_ids(self) -> list[str]:
        """Every task's id, oldest first (one query; :meth:`tasks` reads each task whole)."""
        return [row["task_id"] for row in self._query("SELECT task_id FROM tasks ORDER BY created_at")]

    def tasks(self) -> list[TaskRow]:
        return [task for task in (self.task(task_id) for task_id in self.task_ids()) if task is not None]

    def create_task(self, task_id: str, request: list[dict[str, Any]], *, now: float, lease_until: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, ?)",
                (task_id, now, lease_until, json.dumps(request, sort_keys=True)),
            )
            db.executemany(
                "INSERT INTO task_datasets VALUES (?, ?, NULL)", [(task_id, item["name"]) for item in request]
            )

    def renew_task(self, task_id: str, lease_until: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE tasks SET lease_until = MAX(lease_until, ?) WHERE task_id = ?", (lease_until, task_id))

    def bind(self, task_id: str, name: str, digest: str) -> None:
        """Pin the version a task uses (tasks keep their version when the source changes)."""
        with self._tx() as db:
            db.execute("UPDATE task_datasets SET digest = ? WHERE task_id = ? AND name = ?", (digest, task_id, name))

    def delete_task(self, task_id: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,)).rowcount > 0

    def expired_tasks(self, now: float) -> list[str]:
        return [row["task_id"] for row in self._query("SELECT task_id FROM tasks WHERE lease_until <= ?", (now,))]

    # -- tenants (docs/operator-guide/tenancy.md) --------------------------------------------------------

    def record_tenant(self, task_id: str, namespace: str, sources: Sequence[tuple[str, str]]) -> None:
        """The task acts for ``namespace``, which asked for each ``(name, source)``."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO task_tenants VALUES (?, ?)", (task_id, namespace))
            db.executemany(
                "INSERT OR IGNORE INTO tenant_sources VALUES (?, ?, ?)",
                [(name, source, namespace) for name, source in sources],
            )

    def tenant_of(self, task_id: str) -> str | None:
        rows = self._query("SELECT namespace FROM task_tenants WHERE task_id = ?", (task_id,))
        return str(rows[0]["namespace"]) if rows else None

    def tenant_pinned(self, namespace: str, now: float) -> int:
        """Bytes of the versions the live tasks acting for ``namespace`` hold (each version once)."""
        rows = self._query(
            "SELECT COALESCE(SUM(v.size_bytes), 0) AS pinned FROM versions v JOIN"
            " (SELECT DISTINCT d.name, d.digest FROM task_datasets d JOIN tasks t USING (task_id)"
            "  JOIN task_tenants n USING (task_id)"
            "  WHERE n.namespace = ? AND d.digest IS NOT NULL AND t.lease_until > ?) p"
            " ON v.name = p.name AND v.digest = p.digest",
            (namespace, now),
        )
        return int(rows[0]["pinned"])

    def tenant_holdings(self, namespace: str, now: float) -> list[tuple[str, str, str, int]]:
        """``(task, name, digest, bytes)`` of each version a live task acting for ``namespace``
        is bound to (a version held by two of its tasks is listed twice: the caller counts it once)."""
        rows = self._query(
            "SELECT d.task_id, d.name, d.digest, v.size_bytes FROM task_datasets d JOIN tasks t USING (task_id)"
            " JOIN task_tenants n USING (task_id) JOIN versions v ON v.name = d.name AND v.digest = d.digest"
            " WHERE n.namespace = ? AND d.digest IS NOT NULL AND t.lease_until > ?",
            (namespace, now),
        )
        return [(str(r["task_id"]), str(r["name"]), str(r["digest"]), int(r["size_bytes"])) for r in rows]

    def tenants_of(self, name: str, source: str) -> set[str]:
        """The namespaces that asked for ``name`` from ``source``."""
        rows = self._query("SELECT namespace FROM tenant_sources WHERE name = ? AND source = ?", (name, source))
        return {str(row["namespace"]) for row in rows}

    def forget_tenant(self, name: str, source: str, namespace: str) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM tenant_sources WHERE name = ? AND source = ? AND namespace = ?", (name, source, namespace)
            )

    def holders(self, name: str, now: float) -> list[str]:
        """The tasks, oldest first, whose live lease holds a version of dataset ``name``."""
        rows = self._query(
            "SELECT DISTINCT d.task_id, t.created_at FROM task_datasets d JOIN tasks t USING (task_id)"
            " WHERE d.name = ? AND d.digest IS NOT NULL AND t.lease_until > ? ORDER BY t.created_at, d.task_id",
            (name, now),
        )
        return [str(row["task_id"]) for row in rows]

    def in_use(self, now: float, except_tasks: Sequence[str] = ()) -> set[tuple[str, str]]:
        """``(name, digest)`` of every version bound to a task whose lease has not lapsed,
        other than the tasks ``except_tasks``."""
        others = " AND t.task_id NOT IN (" + ",".join("?" * len(except_tasks)) + ")" if except_tasks else ""
        rows = self._query(
            "SELECT DISTINCT d.name, d.digest FROM task_datasets d JOIN tasks t USING (task_id)"
            " WHERE d.digest IS NOT NULL AND t.lease_until > ?" + others,
            (now, *except_tasks),
        )
        return {(row["name"], row["digest"]) for row in rows}


__all__ = ["Catalog", "CatalogDamaged", "CatalogError", "TaskRow", "VersionRow"]
