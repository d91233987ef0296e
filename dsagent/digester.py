"""Digesting a dataset source: walk any fsspec URL or local path, hash every file.

Who calls it: :func:`dsagent.manifest.build_manifest` (its public face), and so
``dsctl digest / pack`` and the agent. What it owns:

- the walk: local trees with ``os.scandir`` (lazily, by ``d_type``, following symlinks,
  refusing loops, FIFOs, sockets and devices), other filesystems with ``fs.find``;
- hashing on a thread pool while the walk goes on (xxhash and file reads release the
  GIL; each local file is stat'ed, matched against the
  :class:`~dsagent.digestcache.DigestCache` and read on the digest threads);
- files that change while they are digested (:class:`IntegrityError`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from dsagent.errors import IntegrityError, InvalidInput, NotFound
from dsagent.hashing import CHUNK_SIZE, hash_file, hash_stream
from dsagent.manifest import FileEntry, Manifest, Progress, check_dataset_name
from dsagent.storage import resolve, translate_errors

if TYPE_CHECKING:
    from dsagent.digestcache import DigestCache

#: Digest threads for remote sources, where each file costs a round trip.
REMOTE_WORKERS = 16


class _Found(NamedTuple):
    """A file found by the walk, before hashing (a tuple: the walk makes millions)."""

    path: str  # relative to the source root
    location: str  # where to read it (absolute local path or fsspec path)
    size: int
    mtime_ns: int
    inode: int = 0
    ctime_ns: int = 0


def is_local(fs: AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


#: inode of a local file the walk listed but did not stat yet
_UNSTATED = -1


def _iter_local(root: str, empty: list[str]) -> Iterator[_Found]:
    """Files under a local ``root`` as the walk finds them (empty directories go to ``empty``).

    Follows symlinks (a linked file is packed as a regular file) and refuses loops.
    """
    seen: set[tuple[int, int]] = set()
    stack = [("", root)]
    while stack:
        rel, directory = stack.pop()
        st = os.stat(directory)
        if (st.st_dev, st.st_ino) in seen:
            raise InvalidInput(f"directory loop through symlinks at {directory!r}", hint="remove the looping link")
        seen.add((st.st_dev, st.st_ino))
        has_child = False
        with os.scandir(directory) as it:
            for item in it:
                has_child = True
                child = f"{rel}/{item.name}" if rel else item.name
                # d_type answers without a syscall (except through symlinks); the stat that
                # sizes and dates a file happens on the digest threads, in parallel
                if item.is_dir():
                    stack.append((child, item.path))
                elif item.is_file():
                    yield _Found(child, item.path, -1, 0, _UNSTATED, 0)
                elif item.is_symlink() and not os.path.exists(item.path):
                    raise InvalidInput(f"broken symlink in source: {item.path!r}", hint="fix or remove the link")
                else:
                    raise InvalidInput(f"not a regular file: {item.path!r}", hint="datasets hold regular files only")
        if not has_child and rel:
            empty.append(rel)


def _walk_local(root: str) -> tuple[list[_Found], list[str]]:
    empty: list[str] = []
    return list(_iter_local(root, empty)), empty


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


def _walk_remote(fs: AbstractFileSystem, root: str) -> tuple[list[_Found], list[str]]:
    listing = fs.find(root, withdirs=True, detail=True)
    prefix = root.rstrip("/") + "/"
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    quoted = any(p in ("http", "https") for p in protocols)  # URLs name files percent-encoded
    found: list[_Found] = []
    dirs: list[str] = []
    for full, info in listing.items():
        full = full.rstrip("/")
        if not full.startswith(prefix):
            continue
        rel = unquote(full[len(prefix) :]) if quoted else full[len(prefix) :]
        if info.get("type") == "directory":
            dirs.append(rel)
        else:
            size = info.get("size")  # http listings give none: -1, taken from the read
            found.append(_Found(rel, full, int(size) if size is not None else -1, _mtime_ns(info)))
    parents = {f.path.rsplit("/", 1)[0] for f in found if "/" in f.path}
    parents |= {d.rsplit("/", 1)[0] for d in dirs if "/" in d}
    return found, [d for d in dirs if d not in parents]


def walk_source(fs: AbstractFileSystem, root: str, empty: list[str]) -> Iterable[_Found]:
    """Every file of the dataset at ``root`` (empty directories go to ``empty``); a lone file is a dataset of one.

    Local trees are walked lazily, so hashing starts while the walk goes on.
    """
    with translate_errors(f"source {root!r}"):
        if not fs.exists(root):
            raise NotFound(f"dataset source {root!r} does not exist", hint="check the path or URL")
        if not fs.isdir(root):
            info = fs.info(root)
            name = root.rstrip("/").rsplit("/", 1)[-1]
            if is_local(fs):
                st = os.stat(root)
                return [_Found(name, root, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)]
            size = info.get("size")
            return [_Found(name, root, int(size) if size is not None else -1, _mtime_ns(info))]
        if is_local(fs):
            return _iter_local(root, empty)
        found, dirs = _walk_remote(fs, root)
        empty.extend(dirs)
        return found


# --------------------------------------------------------------------------- digesting


def default_workers() -> int:
    """Hashing threads: one per core (reads and xxh3 release the GIL), capped."""
    return min(8, os.cpu_count() or 1)


class _Hasher:
    """Stats, looks up and hashes batches of found files; called from the digest threads.

    Each result is ``(entry, found)`` where ``found`` is the stat'ed file when it was
    hashed (to be recorded in the digest cache) and ``None`` when the cache answered.
    """

    def __init__(self, fs: AbstractFileSystem, progress: Progress | None, cache: DigestCache | None, snapshot: dict[str, Any]) -> None:
        self._fs = fs
        self._local = is_local(fs)
        self._progress = progress
        self._cache = cache
        self._snapshot = snapshot
        self._lock = threading.Lock()

    def batch(self, items: Sequence[_Found]) -> list[tuple[FileEntry, _Found | None]]:
        buffer = bytearray(CHUNK_SIZE) if self._local else None
        results: list[tuple[FileEntry, _Found | None]] = []
        item = None
        try:
            for item in items:
                results.append(self._one(item, buffer))
        except OSError as exc:  # translated here, once per batch rather than per file
            where = item.location if item is not None else "?"
            with translate_errors(f"source file {where!r}"):
                raise exc
        if self._progress is not None:
            with self._lock:
                self._progress(sum(entry.size for entry, _ in results), len(results))
        return results

    def _one(self, item: _Found, buffer: bytearray | None) -> tuple[FileEntry, _Found | None]:
        if buffer is None:
            with self._fs.open(item.location, "rb") as stream:
                digest, size = hash_stream(stream)
        else:
            if item.inode == _UNSTATED:
                st = os.stat(item.location)
                item = _Found(item.path, item.location, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
            if self._cache is not None:
                known = self._cache.match(self._snapshot, item)
                if known is not None:
                    return FileEntry(item.path, item.size, item.mtime_ns, known), None
            digest, size = hash_file(item.location, buffer)
        if size != item.size and item.size >= 0:
            raise IntegrityError(f"{item.path!r} changed while it was digested ({item.size} -> {size} bytes)", hint="retry once the source is quiet")
        return FileEntry(item.path, size, item.mtime_ns, digest), item


class _Batches:
    """Hashes files in batches of 32 on a thread pool, or inline with one worker."""

    SIZE = 32

    def __init__(self, hasher: _Hasher, workers: int) -> None:
        self._hasher = hasher
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dsagent-digest") if workers > 1 else None
        self._batch: list[_Found] = []
        self._futures: list[Future[list[tuple[FileEntry, _Found | None]]]] = []
        self._inline: list[tuple[FileEntry, _Found | None]] = []

    def add(self, item: _Found) -> None:
        self._batch.append(item)
        if len(self._batch) >= self.SIZE:
            self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        if self._pool is None:
            self._inline.extend(self._hasher.batch(self._batch))
        else:
            self._futures.append(self._pool.submit(self._hasher.batch, self._batch))
        self._batch = []

    def results(self) -> list[tuple[FileEntry, _Found | None]]:
        self._flush()
        try:
            return self._inline + [entry for future in self._futures for entry in future.result()]
        finally:
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            for future in self._futures:
                future.cancel()
            self._pool.shutdown(wait=True)


def digest_files(
    fs: AbstractFileSystem,
    found: Iterable[_Found],
    *,
    root: str = "",
    workers: int | None = None,
    digest_cache: DigestCache | None = None,
    progress: Progress | None = None,
) -> list[FileEntry]:
    """Entries for ``found`` (consumed lazily), taking unchanged files' digests from ``digest_cache``.

    Hashing runs on ``workers`` threads while ``found`` is still being walked.
    """
    cache = digest_cache if is_local(fs) else None
    snapshot = cache.snapshot(root) if cache is not None else {}
    # local reads are CPU-bound (one thread per core); remote ones wait on round trips
    hasher = _Hasher(fs, progress, cache, snapshot)
    batches = _Batches(hasher, workers or (default_workers() if is_local(fs) else REMOTE_WORKERS))
    try:
        for item in found:
            batches.add(item)
    except BaseException:
        batches.close()
        raise
    results = batches.results()
    if cache is not None:
        fresh = [(item, entry.digest) for entry, item in results if item is not None]
        cache.record(hits=len(results) - len(fresh), misses=len(fresh))
        cache.store(fresh)
    return [entry for entry, _ in results]


def digest_source(
    source: str | os.PathLike[str],
    *,
    name: str,
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    digest_cache: DigestCache | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Walk and digest the dataset at ``source`` (a local path or any fsspec URL).

    ``digest_cache`` (local sources only) skips re-reading files whose path, size, mtime,
    ctime and inode are unchanged. ``progress(bytes, files)`` is called as files are done.
    Raises :class:`NotFound` if ``source`` does not exist, :class:`InvalidInput` for
    special files or broken links in it, :class:`SourceUnavailable` when reading fails.
    """
    check_dataset_name(name)
    fs, root = resolve(source, storage_options)
    empty_dirs: list[str] = []
    found = walk_source(fs, root, empty_dirs)
    with translate_errors(f"source {os.fspath(source)!r}"):
        entries = digest_files(fs, found, root=root, workers=workers, digest_cache=digest_cache, progress=progress)
    return Manifest.create(name, entries, directories=empty_dirs)
