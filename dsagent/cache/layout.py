"""The on-disk layout of the cache root, and the only code that names paths inside it.

Who calls it: the service's parts (:mod:`dsagent.cache.versions` to fetch and publish,
:mod:`dsagent.cache.space` to remove, :mod:`dsagent.cache.recovery` to reconcile) and
:mod:`dsagent.cache.fetch` for staging directories.
What it owns::

    <root>/catalog.db                      SQLite catalog (WAL)
    <root>/digests.db                      digest cache for local sources (stat-keyed)
    <root>/datasets/<name>/<digest>/       ready datasets: what pods mount, never modified
    <root>/manifests/<name>/<digest>       the manifest of each cached version
    <root>/staging/<name>@<digest>/        fetches in progress (resumable after a crash)
    <root>/staging/<name>@pending-<token>/ per-file copies whose digest is not known yet
    <root>/trash/                          deletions: renamed here atomically, then removed

A dataset becomes ready by one ``rename`` of its staging directory (then an fsync of the
parent), so a crash leaves either the whole dataset or none of it under ``datasets/``.
Names and digests are validated before they become path components, and every path is
checked to lie inside the root, so nothing from a request can escape it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from dsagent.errors import InvalidInput
from dsagent.format.durable import fsync_dir, write_atomic
from dsagent.format.names import is_digest, is_name, validate_digest, validate_name

#: A dataset version's identity in the cache, the one key every part of the service uses:
#: ``(dataset name, version digest)``; while a copy's digest is still unknown the second
#: slot holds ``pending-<token>``.
Key = tuple[str, str]


@dataclass(frozen=True)
class DiskUsage:
    total: int
    free: int


def block_size_of(path: Path) -> int:
    """The allocation unit of the filesystem holding ``path`` (4 KiB on ext4, xfs and tmpfs)."""
    try:
        return max(512, os.statvfs(path).f_frsize)
    except OSError:
        return 4096


def allocated(size_bytes: int, files: int, block_size: int) -> int:
    """An upper bound of the disk ``files`` files of ``size_bytes`` bytes in all take: each
    file's last block partly used, plus one block per file for its inode and directory
    entry (20,000 files of 512 B need ~80 MB, not 10). The unit of the
    capacity and of every space figure the agent reports."""
    return size_bytes + 2 * files * block_size


class Store:
    """Paths and atomic moves under one cache root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        for sub in ("datasets", "manifests", "staging", "trash"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @property
    def catalog_path(self) -> Path:
        return self.root / "catalog.db"

    def _inside(self, path: Path) -> Path:
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root.resolve()):
            raise InvalidInput(f"path {path} escapes the cache root")
        return path

    def ready_dir(self, name: str, digest: str) -> Path:
        return self._inside(self.root / "datasets" / validate_name(name) / validate_digest(digest))

    def staging_dir(self, name: str, digest: str) -> Path:
        return self._inside(self.root / "staging" / f"{validate_name(name)}@{validate_digest(digest)}")

    def pending_dir(self, name: str, token: str) -> Path:
        """Staging for a copy whose digest is not known yet (renamed by :meth:`adopt`)."""
        if not re.fullmatch(r"[0-9a-f]{8,32}", token):
            raise InvalidInput(f"invalid staging token {token!r}")
        return self._inside(self.root / "staging" / f"{validate_name(name)}@pending-{token}")

    def adopt(self, name: str, token: str, digest: str) -> Path:
        """Give a finished pending copy its version's staging name (then :meth:`publish`)."""
        pending, staging = self.pending_dir(name, token), self.staging_dir(name, digest)
        stale = staging.exists()
        if stale:  # what an earlier adoption of this version left when its publication failed
            self._trash(staging)
        os.rename(pending, staging)
        if stale:
            self.empty_trash()
        return staging

    def discard_pending(self, name: str, token: str) -> None:
        path = self.pending_dir(name, token)
        if path.exists():
            try:
                self._trash(path)
            except OSError:
                # a full disk can refuse the rename into the trash; a pending copy is owned by
                # no record (a half-removed one is removed at the next start), so it goes in place
                shutil.rmtree(path, ignore_errors=True)
            self.empty_trash()

    def discard_orphan_pending(self, name: str, live: Collection[str]) -> None:
        """Remove ``name``'s pending copies whose token is not in ``live``: what a copy
        could not remove when it failed (a disk failing every write refuses that too)."""
        for entry in (self.root / "staging").glob(f"{name}@pending-*"):
            token = entry.name.rpartition("@pending-")[2]
            if token not in live and re.fullmatch(r"[0-9a-f]{8,32}", token):
                self.discard_pending(name, token)

    def manifest_path(self, name: str, digest: str) -> Path:
        return self._inside(self.root / "manifests" / validate_name(name) / validate_digest(digest))

    def write_manifest(self, name: str, digest: str, data: bytes) -> None:
        """Stage, fsync, rename: the manifest is whole or absent."""
        path = self.manifest_path(name, digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)

    def read_manifest_bytes(self, name: str, digest: str) -> bytes | None:
        try:
            return self.manifest_path(name, digest).read_bytes()
        except FileNotFoundError:
            return None

    def publish(self, name: str, digest: str) -> Path:
        """Atomically move a finished staging directory into place; returns the ready path."""
        staging, ready = self.staging_dir(name, digest), self.ready_dir(name, digest)
        ready.parent.mkdir(parents=True, exist_ok=True)
        stale = ready.exists()
        if stale:  # a stale copy (e.g. a publication whose commit failed): replace it whole
            self._trash(ready)
        fsync_dir(staging)
        os.rename(staging, ready)
        fsync_dir(ready.parent)
        if stale:
            self.empty_trash()
        return ready

    def remove(self, name: str, digest: str) -> None:
        """Delete a version's data and manifest (rename first, so a crash never leaves half)."""
        for path in (self.ready_dir(name, digest), self.staging_dir(name, digest)):
            if path.exists():
                self._trash(path)
        self.manifest_path(name, digest).unlink(missing_ok=True)
        self.empty_trash()

    def discard_staging(self, name: str, digest: str) -> None:
        path = self.staging_dir(name, digest)
        if path.exists():
            self._trash(path)
            self.empty_trash()

    def _trash(self, path: Path) -> None:
        os.rename(path, self.root / "trash" / uuid.uuid4().hex)

    def empty_trash(self) -> None:
        for entry in (self.root / "trash").iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def on_disk(self) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """``(ready, staging)`` version keys found on disk; unparseable entries are trashed."""
        ready: set[tuple[str, str]] = set()
        for name_dir in (self.root / "datasets").iterdir():
            for version in name_dir.iterdir() if name_dir.is_dir() else ():
                if _valid_key(name_dir.name, version.name) and version.is_dir():
                    ready.add((name_dir.name, version.name))
                else:
                    self._trash(version)
        staging: set[tuple[str, str]] = set()
        for entry in (self.root / "staging").iterdir():
            name, _, digest = entry.name.rpartition("@")
            if _valid_key(name, digest) and entry.is_dir():
                staging.add((name, digest))
            else:
                self._trash(entry)
        return ready, staging

    def clear_temporary_manifests(self) -> None:
        """Remove what a stop in the middle of :meth:`write_manifest` left: its temporary
        file (the kill -9 sweep of tools/faults finds them; nothing else removes them)."""
        for name_dir in (self.root / "manifests").iterdir():
            for entry in name_dir.glob(".*.tmp") if name_dir.is_dir() else ():
                entry.unlink(missing_ok=True)

    def prune_empty_names(self) -> None:
        for sub in ("datasets", "manifests"):
            for name_dir in (self.root / sub).iterdir():
                if name_dir.is_dir() and not any(name_dir.iterdir()):
                    name_dir.rmdir()

    def disk_usage(self) -> DiskUsage:
        usage = shutil.disk_usage(self.root)
        return DiskUsage(total=usage.total, free=usage.free)

    @functools.cached_property
    def block_size(self) -> int:
        """The cache filesystem's allocation unit (4 KiB on ext4, xfs and tmpfs)."""
        return block_size_of(self.root)

    def allocated(self, size_bytes: int, files: int) -> int:
        """What a version of ``files`` files and ``size_bytes`` bytes takes on this cache's
        disk: :func:`allocated`."""
        return allocated(size_bytes, files, self.block_size)

    def staged_bytes(self, name: str, digest: str) -> int:
        """Disk already taken by the staging directory of ``name@digest`` (a resumed fetch's own)."""
        total = 0
        for top, _, names in os.walk(self.staging_dir(name, digest)):
            for item in names:
                try:
                    total += os.lstat(os.path.join(top, item)).st_blocks * 512
                except OSError:
                    continue
        return total


def _valid_key(name: str, digest: str) -> bool:
    return is_name(name) and is_digest(digest)


__all__ = ["DiskUsage", "Key", "Store", "allocated", "block_size_of", "validate_digest", "validate_name"]
