"""Getting one dataset version into its staging directory: bundles or per-file copies.

Who calls it: :mod:`dsagent.service`, which owns the staging directory, the catalog and
the concurrency limits, and passes in an executor and a worker count (rule 6).
What it owns: the two fetch paths and their progress counters.

- **Packed** (the source has a manifest in a bundle store): each bundle is downloaded and
  unpacked by :func:`dsagent.bundle.unpack_bundle`, which verifies every file while
  writing; bundles already verified before a crash are skipped (the service tells us
  which), and a bundle interrupted by a crash is cleared before it is fetched again.
- **Per-file** (no bundle store): every file is copied from the source while its xxh3-128
  is computed, then checked against the manifest the service resolved, so the digest
  recorded for the copy is the digest of what was written.

Blocking work (fsspec, zstd, tar, hashing, fsync) runs in the executor, never on the loop.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dsagent.bundle import unpack_bundle
from dsagent.errors import IntegrityError, InvalidInput
from dsagent.extract import STAGING_DIR, create_empty_directories
from dsagent.manifest import CHUNK_SIZE, BundleRef, FileEntry, FileHasher, Manifest
from dsagent.storage import resolve, translate_errors

_T = TypeVar("_T")


@dataclass(frozen=True)
class Source:
    """Where a version comes from. ``storage_options`` may hold credentials: never log it."""

    url: str
    bundles: str | None = None
    storage_options: Mapping[str, Any] | None = None


class Progress:
    """Bytes and files done of the totals; updated from worker threads, read by the API."""

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


def listing_matches(source: Source, manifest: Manifest) -> bool:
    """Whether a remote source still lists exactly ``manifest``'s files with their sizes and
    modification times: then its digest is ``manifest.digest`` without reading a byte.

    The remote counterpart of the local stat-keyed digest cache. Any doubt (a listing
    without sizes or times, an extra or missing file) answers False, and the caller
    digests the source.
    """
    fs, root = resolve(source.url, source.storage_options)
    if _is_local(fs) or not manifest.entries:
        return False
    prefix = root.rstrip("/") + "/"
    with translate_errors(f"source {source.url!r}"):
        listing = fs.find(root, detail=True)
    seen: dict[str, tuple[int, int]] = {}
    for full, info in listing.items():
        if info.get("type") == "directory" or not full.startswith(prefix):
            continue
        size, mtime = info.get("size"), _mtime_ns(info)
        if size is None or mtime == 0:
            return False
        seen[full[len(prefix):]] = (int(size), mtime)
    return seen == {e.path: (e.size, e.mtime_ns) for e in manifest.entries}


def _is_local(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return bool({"file", "local"} & set(protocols))


def _mtime_ns(info: Mapping[str, Any]) -> int:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created", "modified"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1_000_000_000)
        try:
            return int(float(value) * 1_000_000_000)
        except (TypeError, ValueError):
            continue
    return 0


def safe_target(root: Path, relative: str) -> Path:
    """``root/relative``, refusing anything that would land outside ``root``."""
    parts = relative.split("/")
    if not relative or relative.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in relative:
        raise InvalidInput(f"unsafe path {relative!r} in a manifest")
    return root.joinpath(*parts)


def copy_file(fs: Any, source_path: str, dest: Path, entry: FileEntry, progress: Progress) -> None:
    """Copy one file, hashing while copying; the copy is removed unless its digest matches."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    hasher = FileHasher()
    try:
        with translate_errors(f"source file {entry.path!r}"), fs.open(source_path, "rb") as src, open(dest, "wb") as out:
            while chunk := src.read(CHUNK_SIZE):
                hasher.update(chunk)
                out.write(chunk)
                progress.add(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if hasher.hexdigest() != entry.digest:
            raise IntegrityError(
                f"{entry.path!r} changed while it was cached (digest {hasher.hexdigest()} != {entry.digest})",
                hint="the source changed during the fetch; request the dataset again",
            )
        os.utime(dest, ns=(entry.mtime_ns, entry.mtime_ns))
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    progress.add(0, 1)


async def _bounded(executor: Executor, workers: int, calls: Iterable[Callable[[], _T]], after: Callable[[int], Awaitable[None]] | None = None) -> None:
    """Run blocking ``calls`` with at most ``workers`` at once; the first error wins."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(workers)
    failure: list[BaseException] = []

    async def one(index: int, call: Callable[[], _T]) -> None:
        async with gate:
            if failure:
                return
            try:
                await loop.run_in_executor(executor, call)
                if after is not None:
                    await after(index)
            except BaseException as exc:  # collected, re-raised once below
                failure.append(exc)

    await asyncio.gather(*(one(i, call) for i, call in enumerate(calls)))
    if failure:
        raise failure[0]


async def fetch_files(source: Source, manifest: Manifest, staging: Path, *, progress: Progress, executor: Executor, workers: int) -> None:
    """Per-file copy of every entry of ``manifest`` from ``source.url`` into ``staging``."""
    fs, root = resolve(source.url, source.storage_options)
    base = root.rstrip("/")
    calls = [
        functools.partial(copy_file, fs, f"{base}/{entry.path}", safe_target(staging, entry.path), entry, progress)
        for entry in manifest.entries
    ]
    await _bounded(executor, workers, calls)


def link_bundle(origin: Path, staging: Path, entries: Sequence[FileEntry], progress: Progress) -> None:
    """Hard-link (or copy across filesystems) a bundle's files from another cached version."""
    for entry in entries:
        src, dest = safe_target(origin, entry.path), safe_target(staging, entry.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
        progress.add(entry.size, 1)


def clear_interrupted(staging: Path) -> None:
    """Remove what a crash left of bundles being unpacked (their private staging area).

    A bundle's files reach ``staging`` only after the whole bundle verified, each by an
    atomic rename, so files already in place are whole; re-unpacking replaces them.
    """
    shutil.rmtree(staging / STAGING_DIR, ignore_errors=True)


def finish(staging: Path, manifest: Manifest) -> None:
    """Create the manifest's empty directories; the tree is then complete."""
    clear_interrupted(staging)
    create_empty_directories(manifest, staging)


async def fetch_bundles(
    source: Source,
    manifest: Manifest,
    staging: Path,
    *,
    done: set[str],
    on_bundle_done: Callable[[BundleRef], Awaitable[None]],
    local: Mapping[str, Path] | None = None,
    progress: Progress,
    executor: Executor,
    workers: int,
) -> None:
    """Unpack every bundle not in ``done`` into ``staging``; ``on_bundle_done`` records each.

    ``local`` maps bundle digests to ready directories of other versions that hold the
    same files: those are hard-linked from there instead of downloaded, so a changed
    dataset only fetches the bundles that changed (cached copies are never modified).
    """
    assert source.bundles is not None
    todo = [b for b in manifest.bundles if b.digest not in done]
    for bundle in manifest.bundles:
        if bundle.digest in done:
            progress.skip(bundle.size, bundle.count)

    clear_interrupted(staging)

    def unpack(bundle: BundleRef) -> None:
        if local and bundle.digest in local:
            link_bundle(local[bundle.digest], staging, manifest.bundle_entries(bundle), progress)
            return
        unpack_bundle(
            source.bundles, manifest, bundle, staging,  # type: ignore[arg-type]
            storage_options=source.storage_options, progress=progress.add,
        )

    async def after(index: int) -> None:
        await on_bundle_done(todo[index])

    await _bounded(executor, workers, [functools.partial(unpack, b) for b in todo], after)


__all__ = ["Progress", "Source", "clear_interrupted", "copy_file", "finish", "listing_matches", "fetch_bundles", "fetch_files", "safe_target"]
