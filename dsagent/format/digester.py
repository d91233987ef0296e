"""Digesting a dataset source: walk any fsspec URL or local path, hash every file.

Who calls it: ``dsctl digest / pack`` and the agent, through :func:`build_manifest` (this
module's public face, building a :class:`~dsagent.format.manifest.Manifest` value). What it owns:

- driving the walk (:mod:`dsagent.format.walk`: local trees with ``os.scandir``, other
  filesystems with ``fs.find``) and hashing what it finds;
- hashing while the walk goes on: a big local tree on one forked process per core
  (:class:`_ProcessPool`; Python's per-file work holds the GIL, so threads cannot use a
  second core on small files), anything else on a thread pool (xxhash and file reads
  release the GIL); each local file is stat'ed, matched against the
  :class:`~dsagent.format.digestcache.DigestCache` and read where it is hashed;
- files that change while they are digested (:class:`IntegrityError`).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

import xxhash

from dsagent.errors import IntegrityError, SourceUnavailable
from dsagent.format import native as native_loops
from dsagent.format.hashing import HASH_BUFFER, ReadBuffer, hash_fd, hash_file, hash_stream, read_buffer
from dsagent.format.manifest import EntryTable, EntryTableBuilder, FileEntry, Manifest, Progress, check_dataset_name
from dsagent.format.storage import open_whole, resolve_local_first, translate_errors
from dsagent.format.walk import (
    UNSTATED,
    Dir,
    Found,
    LocalWalk,
    is_local,
    list_files,
    mtime_ns,
    stated,
    walk_source,
)

if TYPE_CHECKING:
    from concurrent.futures import Future
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from fsspec.spec import AbstractFileSystem

    from dsagent.format.digestcache import DigestCache

#: Digest threads for remote sources, where each file costs a round trip.
REMOTE_WORKERS = 16


# --------------------------------------------------------------------------- digesting


def default_workers() -> int:
    """Hashing threads: one per core (reads and xxh3 release the GIL), capped."""
    return min(8, os.cpu_count() or 1)


class _Hasher:
    """Stats, looks up and hashes batches of found files; called from the digest threads.

    Each result is ``(entry, found)`` where ``found`` is the stat'ed file when it was
    hashed (to be recorded in the digest cache) and ``None`` when the cache answered.
    """

    def __init__(
        self, fs: AbstractFileSystem, progress: Progress | None, cache: DigestCache | None, snapshot: dict[str, Any]
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
            with open_whole(self._fs, item.location, size=item.size if item.size >= 0 else None) as stream:
                digest, size = hash_stream(stream)
        elif self._cache is not None:
            if item.inode == UNSTATED:  # a path stat: a cache hit must not open the file
                item = stated(item, os.stat(item.location))
            known = self._cache.match(self._snapshot, item)
            if known is not None:
                return FileEntry(item.path, item.size, item.mtime_ns, known), None
            digest, size = hash_file(item.location, buffer)
        else:
            fd = os.open(item.location, _O_READ)
            try:
                if item.inode == UNSTATED:
                    item = stated(item, os.fstat(fd))
                digest, size = hash_fd(fd, item.size, buffer)
            finally:
                os.close(fd)
        if size != item.size and item.size >= 0:
            raise _changed(item.path, item.size, size)
        return FileEntry(item.path, size, item.mtime_ns, digest), item


def _changed(path: str, before: int, after: int) -> IntegrityError:
    return IntegrityError(
        f"{path!r} changed while it was digested ({before} -> {after} bytes)", hint="retry once the source is quiet"
    )


_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


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

    Hashing runs while ``found`` is still being walked: on ``workers`` threads, or, for a
    big local tree in a single-threaded process, on one forked process per core (see
    :class:`_ProcessPool`). A local tree without a digest cache is hashed by the native
    extension on threads (:mod:`dsagent.format.native`) when it is built and ``native``
    is not False (None: when it is built; True: it must be).
    """
    cache = digest_cache if is_local(fs) else None
    snapshot = cache.snapshot(root) if cache is not None else {}
    # local reads are CPU-bound (one worker per core); remote ones wait on round trips
    count = workers or (default_workers() if is_local(fs) else REMOTE_WORKERS)
    if native and not native_loops.AVAILABLE:
        raise RuntimeError("the native extension is not built (make native)")
    if isinstance(found, LocalWalk) and cache is None and native is not False and native_loops.AVAILABLE:
        return _native_digest(found.groups, count, progress)
    if isinstance(found, LocalWalk) and count > 1 and can_fork():
        head, rest = _peek(found.groups, PROCESS_MIN_FILES)
        if rest is not None:
            return _ProcessPool(min(count, os.cpu_count() or 1), snapshot if cache is not None else None).digest(
                chain(head, rest), cache, progress
            )
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
        fresh = [(item, entry.digest) for entry, item in results if item is not None]
        cache.record(hits=len(results) - len(fresh), misses=len(fresh))
        cache.store(fresh)
    return [entry for entry, _ in results]


# --------------------------------------------------------------------------- process pool

#: A local tree with at least this many files is hashed on processes (when forking is safe):
#: below it, forking costs more than the parallel Python it buys.
PROCESS_MIN_FILES = 4096

#: Files per request to a hashing process: big enough that a round trip costs well under
#: a microsecond per file, small enough that both processes finish together.
_REQUEST_FILES = 256


def can_fork() -> bool:
    """True where a hashing process can be forked safely: Linux, and no other thread running.

    Forking a multi-threaded process can copy a lock some other thread holds (the agent
    digests on an executor thread, so it keeps the thread path).
    """
    return sys.platform.startswith("linux") and threading.active_count() == 1


def _peek(groups: Iterator[Dir], files: int) -> tuple[list[Dir], Iterator[Dir] | None]:
    """The first groups of the walk holding ``files`` files, and the rest (None if the walk ended)."""
    head: list[Dir] = []
    seen = 0
    for group in groups:
        head.append(group)
        seen += len(group.names)
        if seen >= files:
            return head, groups
    return head, None


def _requests(groups: Iterable[Dir]) -> Iterator[list[Dir]]:
    """The walk's groups packed into requests of about :data:`_REQUEST_FILES` files."""
    rest: Iterator[Dir] | None = iter(groups)
    while rest is not None:
        request, rest = _peek(rest, _REQUEST_FILES)
        if request:
            yield request


#: the digest cache's records under the source root: location -> (size, mtime, inode, ctime, digest)
_Snapshot = dict[str, tuple[int, int, int, int, str]]


class _Reply(NamedTuple):
    """What a hashing process answers for one request: columns, not objects (cheap to pickle)."""

    paths: list[str]
    sizes: list[int]
    mtimes: list[int]
    digests: list[str]
    fresh: list[tuple[Found, str]]  # files hashed (not answered by the cache), only when a cache is used
    error: tuple[str, str, int, int] | tuple[str, str, int, str] | None = None


def _hash_request(request: list[Dir], snapshot: _Snapshot | None, buffer: ReadBuffer) -> _Reply:
    """Hash one request's files in a hashing process (opening each relative to its directory)."""
    reply = _Reply([], [], [], [], [])
    name = ""
    for rel, directory, names in request:
        prefix = f"{rel}/" if rel else ""
        try:
            dfd = os.open(directory, _O_READ | os.O_DIRECTORY)
            try:
                if snapshot is None:
                    error = _hash_names(reply, prefix, names, dfd, buffer)
                    if error is not None:
                        return reply._replace(error=error)
                    continue
                for name in names:
                    error = _hash_one(reply, prefix + name, name, directory, dfd, snapshot, buffer)
                    if error is not None:
                        return reply._replace(error=error)
            finally:
                os.close(dfd)
        except OSError as exc:
            failed = exc.filename if isinstance(exc.filename, str) else name
            where = directory if failed == directory else os.path.join(directory, failed)
            return reply._replace(error=("os", where, exc.errno or 0, exc.strerror or str(exc)))
    return reply


def _hash_names(
    reply: _Reply, prefix: str, names: list[str], dfd: int, buffer: ReadBuffer
) -> tuple[str, str, int, int] | None:
    """Append the columns of files ``names`` in directory ``dfd`` to ``reply`` (no cache).

    The hot loop of a big digest, kept to four system calls and one hash per small file
    with the library calls bound to locals: Python's own work here is most of what a file
    costs above the read itself.
    """
    view, limit = memoryview(buffer), len(buffer)
    paths, sizes, mtimes, digests = reply.paths, reply.sizes, reply.mtimes, reply.digests
    open_, fstat, readv, close, one_shot = os.open, os.fstat, os.readv, os.close, xxhash.xxh3_128_hexdigest
    for name in names:
        try:
            fd = open_(name, _O_READ, dir_fd=dfd)
            try:
                st = fstat(fd)
                expected = size = st.st_size
                if expected < limit and readv(fd, [view[: expected + 1]]) == expected:
                    digest = one_shot(view[:expected])  # the +1 byte asked for did not come: all read
                else:  # big, or not the stat'ed size any more: start again, streaming
                    os.lseek(fd, 0, os.SEEK_SET)
                    digest, size = hash_fd(fd, expected, buffer)
            finally:
                close(fd)
        except OSError as exc:
            exc.filename = name  # which file, for the caller's message
            raise
        if size != expected:
            return ("changed", prefix + name, expected, size)
        paths.append(prefix + name)
        sizes.append(size)
        mtimes.append(st.st_mtime_ns)
        digests.append(digest)
    return None


def _hash_one(
    reply: _Reply, path: str, name: str, directory: str, dfd: int, snapshot: _Snapshot | None, buffer: ReadBuffer
) -> tuple[str, str, int, int] | None:
    """Append one file's columns to ``reply`` (the error instead if it changed while read)."""
    if snapshot is not None:
        location = os.path.join(directory, name)
        st = os.stat(name, dir_fd=dfd)  # a path stat: a cache hit must not open the file
        row = snapshot.get(location)
        if row is not None and row[:4] == (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns):
            reply.paths.append(path)
            reply.sizes.append(st.st_size)
            reply.mtimes.append(st.st_mtime_ns)
            reply.digests.append(row[4])
            return None
    fd = os.open(name, _O_READ, dir_fd=dfd)
    try:
        if snapshot is None:
            st = os.fstat(fd)
        digest, size = hash_fd(fd, st.st_size, buffer)
    finally:
        os.close(fd)
    if size != st.st_size:
        return ("changed", path, st.st_size, size)
    reply.paths.append(path)
    reply.sizes.append(size)
    reply.mtimes.append(st.st_mtime_ns)
    reply.digests.append(digest)
    if snapshot is not None:
        reply.fresh.append((Found(path, location, size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns), digest))
    return None


def _serve(conn: Connection, snapshot: _Snapshot | None, inherited: list[Connection]) -> None:
    """A hashing process: answer requests until the parent says stop (None) or goes away.

    ``inherited`` are the parent's ends of the pipes, copied by the fork: closed here so
    that a parent that dies (even by kill -9) ends every worker's ``recv``.
    """
    for other in inherited:
        other.close()
    # Ctrl-C reaches the whole process group: the parent handles it (and kills this one)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # replies hold no cycles; the collector would only walk (and so copy, page by page)
    # the objects this process shares with its parent
    gc.disable()
    buffer = read_buffer()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        try:
            conn.send(_hash_request(request, snapshot, buffer))
        except OSError:  # the parent stopped listening (it failed): nothing left to do
            return


class _ProcessPool:
    """Hashes a local tree on forked processes, one per core, while this process walks it.

    Python spends ~15 us per file on bookkeeping under the GIL, so threads cannot use two
    cores for a tree of small files; processes can. Each gets groups of names (its
    directory opened once, each file opened relative to it, ``fstat`` on the open file, one
    read for a file under :data:`HASH_BUFFER`) and answers columns that this process adds
    to the entry table in request order (so the table is in walk order, nearly path order),
    making no FileEntry objects. The digest cache's snapshot is a plain dict inherited by the fork; only
    this process touches the SQLite connection (it is not fork-safe), recording what the
    workers hashed once they are done.
    """

    #: requests in flight per process: one being hashed, one waiting in its pipe
    DEPTH = 2

    def __init__(self, processes: int, snapshot: _Snapshot | None) -> None:
        self._processes = processes
        self._snapshot = snapshot

    def digest(self, groups: Iterable[Dir], cache: DigestCache | None, progress: Progress | None) -> EntryTable:
        import multiprocessing  # here: `dsctl digest` of a few files forks nothing

        context = multiprocessing.get_context("fork")
        workers: list[tuple[BaseProcess, Connection]] = []
        done = False
        try:
            for _ in range(self._processes):
                mine, theirs = context.Pipe()
                inherited = [conn for _, conn in workers] + [mine]
                process = context.Process(
                    target=_serve, args=(theirs, self._snapshot, inherited), name="dsagent-digest", daemon=True
                )
                process.start()
                theirs.close()
                workers.append((process, mine))
            entries, fresh = self._run([conn for _, conn in workers], groups, progress)
            done = True
        finally:
            _stop(workers, kill=not done)
        if cache is not None:
            cache.record(hits=len(entries) - len(fresh), misses=len(fresh))
            cache.store(fresh)
        return entries

    def _run(
        self, conns: list[Connection], groups: Iterable[Dir], progress: Progress | None
    ) -> tuple[EntryTable, list[tuple[Found, str]]]:
        """Walk and dispatch; replies join the table in request order as they come (while
        the workers still hash)."""
        from multiprocessing.connection import Connection, wait

        pending: dict[Connection, deque[int]] = {conn: deque() for conn in conns}  # request numbers, FIFO
        early: dict[int, _Reply] = {}  # replies that overtook an earlier request's
        table = EntryTableBuilder()
        fresh: list[tuple[Found, str]] = []
        joined = 0  # requests whose columns are in the table

        def receive(ready: Iterable[object]) -> None:
            nonlocal joined
            for conn in ready:
                assert isinstance(conn, Connection)
                try:
                    reply: _Reply = conn.recv()
                except (EOFError, OSError) as exc:
                    raise _died() from exc
                _raise_for(reply)
                early[pending[conn].popleft()] = reply
                fresh.extend(reply.fresh)
                if progress is not None:
                    progress(sum(reply.sizes), len(reply.paths))
            while joined in early:
                reply = early.pop(joined)
                table.add(reply.paths, reply.sizes, reply.mtimes, reply.digests)
                joined += 1

        for number, request in enumerate(_requests(groups)):
            idle = min(pending, key=lambda conn: len(pending[conn]))
            while len(pending[idle]) >= self.DEPTH:
                receive(wait(conns))
                idle = min(pending, key=lambda conn: len(pending[conn]))
            try:
                idle.send(request)
            except OSError as exc:
                raise _died() from exc
            pending[idle].append(number)
        while any(pending.values()):
            receive(wait([conn for conn, numbers in pending.items() if numbers]))
        return table.build(), fresh


def _native_request(request: list[Dir]) -> tuple[list[str], native_loops.Columns]:
    """One request's paths and columns, hashed by the native extension (on a pool thread)."""
    paths: list[str] = []
    sizes: list[int] = []
    mtimes: list[int] = []
    digests: list[bytes] = []
    for rel, directory, names in request:
        prefix = f"{rel}/" if rel else ""
        columns = native_loops.hash_names(directory, names, HASH_BUFFER, prefix=prefix)
        paths.extend([prefix + name for name in names] if prefix else names)
        sizes.extend(columns.sizes)
        mtimes.extend(columns.mtimes)
        digests.append(columns.digests)
    return paths, native_loops.Columns(sizes, mtimes, b"".join(digests))


def _native_digest(groups: Iterable[Dir], threads: int, progress: Progress | None) -> EntryTable:
    """A local tree hashed by the native extension on ``threads`` threads while this one walks.

    The C loop holds no GIL while it opens, reads and hashes, so threads use every core
    without the process pool's forks, pickling and pipes; requests join the table in order.
    """
    from concurrent.futures import ThreadPoolExecutor  # here: the quick digest path imports no pool

    table = EntryTableBuilder()
    pending: deque[Future[tuple[list[str], native_loops.Columns]]] = deque()

    def join(future: Future[tuple[list[str], native_loops.Columns]]) -> None:
        paths, columns = future.result()
        table.add_raw(paths, columns.sizes, columns.mtimes, columns.digests)
        if progress is not None:
            progress(sum(columns.sizes), len(paths))

    with ThreadPoolExecutor(threads, thread_name_prefix="dsagent-digest") as pool:
        try:
            for request in _requests(groups):
                pending.append(pool.submit(_native_request, request))
                while len(pending) > 2 * threads or (pending and pending[0].done()):
                    join(pending.popleft())
            while pending:
                join(pending.popleft())
        finally:
            for future in pending:
                future.cancel()
    return table.build()


def _died() -> SourceUnavailable:
    return SourceUnavailable("a digest process died", hint="see the system log (out of memory?) and retry")


def _raise_for(reply: _Reply) -> None:
    if reply.error is None:
        return
    kind, where, first, second = reply.error
    if kind == "changed":
        assert isinstance(second, int)
        raise _changed(where, first, second)
    with translate_errors(f"source file {where!r}"):
        raise OSError(first, second, where)


def _stop(workers: list[tuple[BaseProcess, Connection]], *, kill: bool) -> None:
    """Reap the hashing processes: idle ones are told to stop; after a failure (when they
    may still be hashing what nobody will read) they are killed."""
    for process, conn in workers:
        if kill:
            process.kill()
        else:
            try:
                conn.send(None)
            except OSError:
                process.kill()
        conn.close()
    for process, _ in workers:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()


def build_manifest(
    source: str | os.PathLike[str],
    *,
    name: str,
    storage_options: Mapping[str, Any] | None = None,
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
