"""Digesting a dataset source: walk any fsspec URL or local path, hash every file.

Who calls it: ``dsctl digest / pack`` and the agent, through :func:`build_manifest` (this
module's public face, building a :class:`~dsagent.format.manifest.Manifest` value). What it owns:

- driving the walk (:mod:`dsagent.format.walk`: local trees with ``os.scandir``, other
  filesystems with ``fs.find``) and hashing what it finds;
- hashing while the walk goes on: a local tree by the native loop where it runs
  (:func:`~dsagent.format.native.hash_tree`: a thread a core started inside each call, no
  GIL held per file); by the pure loop, a big local tree on one forked process per core
  (:class:`~dsagent.format.digestpool.ProcessPool`; Python's per-file work holds the GIL,
  so threads cannot use a second core on small files) and anything else on a thread pool
  (xxhash and file reads release the GIL); with a
  :class:`~dsagent.format.digestcache.DigestCache`, each local file is stat'ed and matched
  against it before it is read;
- files that change while they are digested (:class:`IntegrityError`).
"""

from __future__ import annotations

import os
import threading
from array import array
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import TYPE_CHECKING

from dsagent.format import native as native_loops
from dsagent.format.digestpool import (
    O_READ,
    PROCESS_MIN_FILES,
    ProcessPool,
    can_fork,
    peek,
)
from dsagent.format.hashing import ReadBuffer, changed_error, hash_fd, hash_file, hash_stream, read_buffer
from dsagent.format.manifest import (
    EntryTable,
    EntryTableBuilder,
    FileEntry,
    Manifest,
    Progress,
    check_dataset_name,
    expect_total,
)
from dsagent.format.oneversion import open_one_version
from dsagent.format.storage import resolve_local_first, translate_errors
from dsagent.format.storageconfig import Options
from dsagent.format.walk import (
    UNSTATED,
    Dir,
    Found,
    LocalWalk,
    is_local,
    list_files,
    list_local,
    mtime_ns,
    stated,
    walk_source,
)
from dsplatform import cores

if TYPE_CHECKING:
    from concurrent.futures import Future

    from fsspec.spec import AbstractFileSystem

    from dsagent.format.digestcache import DigestCache, Snapshot

#: Digest threads for remote sources, where each file costs a round trip.
REMOTE_WORKERS = 16


# --------------------------------------------------------------------------- digesting


def default_workers() -> int:
    """Hashing threads: one per core (reads and xxh3 release the GIL), capped."""
    return min(8, cores.usable())


class _Hasher:
    """Stats, looks up and hashes batches of found files; called from the digest threads.

    Each result is ``(entry, found)`` where ``found`` is the stat'ed file when it was
    hashed (to be recorded in the digest cache) and ``None`` when the cache answered.
    """

    def __init__(
        self, fs: AbstractFileSystem, progress: Progress | None, cache: DigestCache | None, snapshot: Snapshot | None
    ) -> None:
        self._fs = fs
        self._local = is_local(fs)
        self._progress = progress
        self._cache = cache
        self._snapshot = snapshot
        self._lock = threading.Lock()

    def batch(self, items: Sequence[Found]) -> list[tuple[FileEntry, Found | None]]:
        buffer = read_buffer() if self._local else None
        results: list[tuple[FileEntry, Found | None]] = []
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

    def _one(self, item: Found, buffer: ReadBuffer | None) -> tuple[FileEntry, Found | None]:
        if buffer is None:
            with open_one_version(self._fs, item.location, size=item.size if item.size >= 0 else None) as stream:
                digest, size = hash_stream(stream)
        elif self._cache is not None and self._snapshot is not None:
            if item.inode == UNSTATED:  # a path stat: a cache hit must not open the file
                item = stated(item, os.stat(item.location))
            known = self._cache.match(self._snapshot, item)
            if known is not None:
                return FileEntry(item.path, item.size, item.mtime_ns, known), None
            digest, size = hash_file(item.location, buffer)
        else:
            fd = os.open(item.location, O_READ)
            try:
                if item.inode == UNSTATED:
                    item = stated(item, os.fstat(fd))
                digest, size = hash_fd(fd, item.size, buffer)
            finally:
                os.close(fd)
        if size != item.size and item.size >= 0:
            raise changed_error(item.path, item.size, size)
        return FileEntry(item.path, size, item.mtime_ns, digest), item


class _Batches:
    """Hashes files in batches of 32 on a thread pool, or inline with one worker."""

    SIZE = 32

    def __init__(self, hasher: _Hasher, workers: int) -> None:
        self._hasher = hasher
        self._pool = None
        if workers > 1:
            from concurrent.futures import ThreadPoolExecutor  # here: one worker needs no pool

            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dsagent-digest")
        self._batch: list[Found] = []
        self._futures: list[Future[list[tuple[FileEntry, Found | None]]]] = []
        self._inline: list[tuple[FileEntry, Found | None]] = []

    def add(self, item: Found) -> None:
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

    def results(self) -> list[tuple[FileEntry, Found | None]]:
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
    found: Iterable[Found],
    *,
    root: str = "",
    workers: int | None = None,
    digest_cache: DigestCache | None = None,
    progress: Progress | None = None,
    native: bool | None = None,
) -> Sequence[FileEntry]:
    """Entries for ``found`` (consumed lazily), taking unchanged files' digests from ``digest_cache``.

    A local tree is hashed by the native extension (:mod:`dsagent.format.native`) when it
    is built and ``native`` is not False (None: when it is built; True: it must be), on a
    thread a core (``workers`` at most) inside each :func:`~dsagent.format.native.hash_tree`
    call: no forked process, and the threads of the C loop scale where Python's do not
    (docs/design-native.md#on-a-node-with-many-cores). Without a digest cache, hashing runs
    while ``found`` is still being walked; with one, the tree is listed and stat'ed first
    and only the files the cache does not answer are read. Otherwise the pure loop hashes on
    ``workers`` threads, or, for a big local tree in a single-threaded process, on one
    forked process per core (``workers`` at most; see :class:`ProcessPool`).
    """
    cache = digest_cache if is_local(fs) else None
    snapshot = cache.snapshot(root) if cache is not None else None
    # local reads are CPU-bound (one worker per core); remote ones wait on round trips
    count = workers or (default_workers() if is_local(fs) else REMOTE_WORKERS)
    cpus = cores.usable()
    if isinstance(found, LocalWalk) and native_loops.chosen(native):
        if cache is None:
            return _tree_digest(found.groups, min(workers or cpus, cpus), progress)
        assert snapshot is not None
        return _cached_tree_digest(found, cache, snapshot, min(workers or cpus, cpus), progress)
    if isinstance(found, LocalWalk) and min(workers or cpus, cpus) > 1 and can_fork():
        head, rest = peek(found.groups, PROCESS_MIN_FILES)
        if rest is not None:  # the pure loop on processes: its threads hold the GIL a file
            pool = ProcessPool(min(workers or cpus, cpus), snapshot)
            return pool.digest(chain(head, rest), cache, progress)
        found = LocalWalk(iter(head))
    hasher = _Hasher(fs, progress, cache, snapshot)
    batches = _Batches(hasher, count)
    try:
        for item in found:
            batches.add(item)
    except BaseException:
        batches.close()
        raise
    results = batches.results()
    if cache is not None:
        assert snapshot is not None
        fresh = [item for _, item in results if item is not None]
        cache.record(hits=len(results) - len(fresh), misses=len(fresh))
        entries = [entry for entry, _ in results]
        cache.store_found(
            snapshot,
            [e.path for e in entries],
            [e.size for e in entries],
            [e.mtime_ns for e in entries],
            bytes.fromhex("".join(e.digest for e in entries)),
            fresh,
        )
    return [entry for entry, _ in results]


#: Files a :func:`native.hash_tree <dsagent.format.native.hash_tree>` call hashes: the walk
#: goes on while a call hashes the files before (the call holds no GIL), and a call's
#: columns stay a few hundred KB.
TREE_BATCH = 8192


class _TreeCall(threading.Thread):
    """One :func:`~dsagent.format.native.hash_tree` call on a thread of its own, so that the
    walk goes on meanwhile; :meth:`columns` waits for it and raises what it raised."""

    def __init__(self, groups: list[Dir], paths: list[str], threads: int) -> None:
        super().__init__(name="dsagent-digest", daemon=True)
        self.groups, self.paths = groups, paths
        self._threads = threads
        self._result: tuple[bytes, bytes, bytes] | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._result = native_loops.hash_tree(self.groups, threads=self._threads)
        except BaseException as exc:  # handed to the walking thread by columns()
            self._error = exc

    def columns(self) -> tuple[bytes, bytes, bytes]:
        self.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def _tree_digest(groups: Iterable[Dir], threads: int, progress: Progress | None) -> EntryTable:
    """A local tree hashed by the native extension, :data:`TREE_BATCH` files a call on
    ``threads`` threads started inside it, while this thread walks on and spells the next
    batch's paths: no Python thread pool, no forked process, no GIL taken per file
    (docs/design-native.md#on-a-node-with-many-cores)."""
    table = EntryTableBuilder()
    running: _TreeCall | None = None

    def finish(call: _TreeCall) -> None:
        sizes, mtimes, digests = call.columns()
        table.add_packed(call.paths, sizes, mtimes, digests)
        if progress is not None:
            progress(sum(memoryview(sizes).cast("q")), len(call.paths))

    def hand_over(batch: list[Dir]) -> _TreeCall:
        """Start ``batch``'s call once the one before it is in the table."""
        paths = [f"{rel}/{name}" if rel else name for rel, _, names in batch for name in names]
        if running is not None:
            finish(running)
        return _TreeCall(batch, paths, threads)

    batch: list[Dir] = []
    files = 0
    try:
        for group in groups:
            batch.append(group)
            files += len(group.names)
            if files >= TREE_BATCH:
                running, batch, files = hand_over(batch), [], 0
        if batch:
            running = hand_over(batch)
        if running is not None:
            last, running = running, None
            finish(last)
    finally:
        if running is not None:
            running.join()  # a failed walk or call: the call ends by itself, its columns unread
    return table.build()


def _cached_tree_digest(
    found: LocalWalk, cache: DigestCache, snapshot: Snapshot, threads: int, progress: Progress | None
) -> EntryTable:
    """A local tree digested by the native extension with the digest cache: listed and
    stat'ed on every core (:func:`~dsagent.format.walk.list_local`), matched against the
    cache's record of the tree column against column, and only the files that miss read,
    :data:`TREE_BATCH` a :func:`~dsagent.format.native.hash_tree` call on ``threads``
    threads; then the tree's record written (when it changed)."""
    listing = list_local(found.root, found.empty, found.confine).in_path_order()
    paths, sizes, mtimes, inodes, ctimes = listing.paths, listing.sizes, listing.mtimes, listing.inodes, listing.ctimes
    expect_total(progress, sum(sizes), len(paths))
    index = snapshot.lookup(paths, sizes, mtimes, inodes, ctimes)
    misses = [k for k, i in enumerate(index) if i < 0]
    if not misses:  # every file as recorded
        cache.record(hits=len(paths), misses=0)
        if progress is not None:
            progress(sum(sizes), len(paths))
        recorded = snapshot.digests
        if paths != snapshot.paths:  # files removed, or recorded in another order: picked out
            recorded = b"".join([recorded[16 * i : 16 * i + 16] for i in index])
            cache.store(snapshot, paths, sizes, mtimes, inodes, ctimes, recorded)
        table = EntryTableBuilder()
        table.add_raw(paths, sizes, mtimes, recorded)
        return table.build()
    whole = len(misses) == len(paths)  # nothing recorded: the digests come in listing order
    digests = bytearray() if whole else bytearray(16 * len(paths))
    if not whole:
        recorded = snapshot.digests
        for k, i in enumerate(index):
            if i >= 0:
                digests[16 * k : 16 * k + 16] = recorded[16 * i : 16 * i + 16]
        if progress is not None:
            progress(sum(sizes) - sum(sizes[k] for k in misses), len(paths) - len(misses))
    read_sizes, read_mtimes = list(sizes), list(mtimes)
    moved: list[int] = []
    # one group from the root, each name the file's relative path (opened below the root's
    # descriptor): no per-file split into directories
    for start in range(0, len(misses), TREE_BATCH):
        batch = misses[start : start + TREE_BATCH]
        names = paths[start : start + len(batch)] if whole else [paths[k] for k in batch]
        packed_sizes, packed_mtimes, packed_digests = native_loops.hash_tree(
            [Dir("", found.root, names)], threads=threads
        )
        got_sizes, got_mtimes = array("q", packed_sizes), array("q", packed_mtimes)
        if whole:
            digests += packed_digests
        else:
            for j, k in enumerate(batch):
                digests[16 * k : 16 * k + 16] = packed_digests[16 * j : 16 * j + 16]
        if got_sizes.tolist() != [sizes[k] for k in batch] or got_mtimes.tolist() != [mtimes[k] for k in batch]:
            for j, k in enumerate(batch):  # changed since listed: taken as read
                if (got_sizes[j], got_mtimes[j]) != (sizes[k], mtimes[k]):
                    read_sizes[k], read_mtimes[k] = got_sizes[j], got_mtimes[j]
                    moved.append(k)
        if progress is not None:
            progress(sum(got_sizes), len(batch))
    raw = bytes(digests)
    cache.record(hits=len(paths) - len(misses), misses=len(misses))
    # a file that changed between its stat and its read is not recorded
    cache.store(snapshot, paths, sizes, mtimes, inodes, ctimes, raw, leave_out=moved)
    table = EntryTableBuilder()
    table.add_raw(paths, read_sizes, read_mtimes, raw)
    return table.build()


def build_manifest(
    source: str | os.PathLike[str],
    *,
    name: str,
    storage_options: Options = None,
    workers: int | None = None,
    digest_cache: DigestCache | None = None,
    progress: Progress | None = None,
    confine: Sequence[str | os.PathLike[str]] | None = None,
    native: bool | None = None,
) -> Manifest:
    """Walk and digest the dataset at ``source`` (a local path or any fsspec URL).

    ``digest_cache`` (local sources only) skips re-reading files whose path, size, mtime,
    ctime and inode are unchanged. ``progress(bytes, files)`` is called as files are done.
    ``confine`` (local sources only) refuses symlinks that resolve outside those directories.
    ``native``: see :func:`digest_files`.
    Raises :class:`NotFound` if ``source`` does not exist, :class:`InvalidInput` for
    special files, broken or escaping links in it, :class:`SourceUnavailable` when reading fails.
    """
    check_dataset_name(name)
    fs, root = resolve_local_first(source, storage_options)
    empty_dirs: list[str] = []
    found = walk_source(fs, root, empty_dirs, confine=None if confine is None else [os.fspath(c) for c in confine])
    with translate_errors(f"source {os.fspath(source)!r}"):
        entries = digest_files(
            fs, found, root=root, workers=workers, digest_cache=digest_cache, progress=progress, native=native
        )
    return Manifest.create(name, entries, directories=empty_dirs)


__all__ = ["REMOTE_WORKERS", "build_manifest", "default_workers", "digest_files", "is_local", "list_files", "mtime_ns"]
