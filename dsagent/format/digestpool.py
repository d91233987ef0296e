"""Hashing a big local tree on one forked process per core, for the digest.

Who calls it: :func:`dsagent.format.digester.digest_files`, for a local tree of at least
:data:`PROCESS_MIN_FILES` files in a process where forking is safe (:func:`can_fork`),
when the pure loops hash it (the native loops are off, or a digest cache is read); the
digest's other paths use :func:`peek` too. What it owns: the hashing processes
(Python's per-file work holds the GIL, so threads cannot use a second core on small
files), the requests of about :data:`REQUEST_FILES` files they are sent, their replies as
columns joined in walk order, the digest cache's snapshot they answer from, and stopping
them (killed after a failure).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

import xxhash

from dsagent.errors import SourceUnavailable
from dsagent.format.hashing import ReadBuffer, changed_error, hash_fd, read_buffer
from dsagent.format.manifest import EntryTable, EntryTableBuilder, Progress
from dsagent.format.storage import translate_errors
from dsagent.format.walk import Dir, Found, signed_inode

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from dsagent.format.digestcache import DigestCache, Snapshot


O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


#: A local tree with at least this many files is hashed on processes (when forking is safe):
#: below it, forking costs more than the parallel Python it buys.
PROCESS_MIN_FILES = 4096

#: Files per request to a hashing process: big enough that a round trip costs well under
#: a microsecond per file, small enough that both processes finish together.
REQUEST_FILES = 256


def can_fork() -> bool:
    """True where a hashing process can be forked safely: Linux, and no other thread running.

    Forking a multi-threaded process can copy a lock some other thread holds (the agent
    digests on an executor thread, so it keeps the thread path).
    """
    return sys.platform.startswith("linux") and threading.active_count() == 1


def peek(groups: Iterator[Dir], files: int) -> tuple[list[Dir], Iterator[Dir] | None]:
    """The first groups of the walk holding ``files`` files, and the rest (None if the walk ended)."""
    head: list[Dir] = []
    seen = 0
    for group in groups:
        head.append(group)
        seen += len(group.names)
        if seen >= files:
            return head, groups
    return head, None


def request_groups(groups: Iterable[Dir]) -> Iterator[list[Dir]]:
    """The walk's groups packed into requests of about :data:`REQUEST_FILES` files."""
    rest: Iterator[Dir] | None = iter(groups)
    while rest is not None:
        request, rest = peek(rest, REQUEST_FILES)
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
    fresh: list[Found]  # files hashed (not answered by the cache), only when a cache is used
    error: tuple[str, str, int, int] | tuple[str, str, int, str] | None = None


def _hash_request(request: list[Dir], snapshot: _Snapshot | None, buffer: ReadBuffer) -> _Reply:
    """Hash one request's files in a hashing process (opening each relative to its directory)."""
    reply = _Reply([], [], [], [], [])
    name = ""
    for rel, directory, names in request:
        prefix = f"{rel}/" if rel else ""
        try:
            dfd = os.open(directory, O_READ | os.O_DIRECTORY)
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
            fd = open_(name, O_READ, dir_fd=dfd)
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
        row = snapshot.get(path)
        if row is not None and row[:4] == (st.st_size, st.st_mtime_ns, signed_inode(st.st_ino), st.st_ctime_ns):
            reply.paths.append(path)
            reply.sizes.append(st.st_size)
            reply.mtimes.append(st.st_mtime_ns)
            reply.digests.append(row[4])
            return None
    fd = os.open(name, O_READ, dir_fd=dfd)
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
        reply.fresh.append(Found(path, location, size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
    return None


def _serve(conn: Connection, snapshot: _Snapshot | None, inherited: list[Connection]) -> None:
    """A hashing process: answer requests until the parent says stop (None) or goes away.

    ``inherited`` are the parent's ends of the pipes, copied by the fork: closed here so
    that a parent that dies (even by kill -9) ends every worker's ``recv``.
    """
    import signal  # here, after the fork: a digest on threads sets no handler

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


class ProcessPool:
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

    def __init__(self, processes: int, snapshot: Snapshot | None) -> None:
        self._processes = processes
        self._snapshot = snapshot

    def digest(self, groups: Iterable[Dir], cache: DigestCache | None, progress: Progress | None) -> EntryTable:
        import multiprocessing  # here: `dsctl digest` of a few files forks nothing

        context = multiprocessing.get_context("fork")
        rows = self._snapshot.rows() if self._snapshot is not None else None  # made once, before the fork
        workers: list[tuple[BaseProcess, Connection]] = []
        done = False
        try:
            for _ in range(self._processes):
                mine, theirs = context.Pipe()
                inherited = [conn for _, conn in workers] + [mine]
                process = context.Process(
                    target=_serve,
                    args=(theirs, rows, inherited),
                    name="dsagent-digest",
                    daemon=True,
                )
                process.start()
                theirs.close()
                workers.append((process, mine))
            entries, fresh = self._run([conn for _, conn in workers], groups, progress)
            done = True
        finally:
            _stop(workers, kill=not done)
        if cache is not None:
            assert self._snapshot is not None
            cache.record(hits=len(entries) - len(fresh), misses=len(fresh))
            cache.store_found(self._snapshot, entries.paths, entries.sizes, entries.mtimes, entries.digests, fresh)
        return entries

    def _run(
        self, conns: list[Connection], groups: Iterable[Dir], progress: Progress | None
    ) -> tuple[EntryTable, list[Found]]:
        """Walk and dispatch; replies join the table in request order as they come (while
        the workers still hash)."""
        from multiprocessing.connection import Connection, wait

        pending: dict[Connection, deque[int]] = {conn: deque() for conn in conns}  # request numbers, FIFO
        early: dict[int, _Reply] = {}  # replies that overtook an earlier request's
        table = EntryTableBuilder()
        fresh: list[Found] = []
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

        for number, request in enumerate(request_groups(groups)):
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


def _died() -> SourceUnavailable:
    return SourceUnavailable("a digest process died", hint="see the system log (out of memory?) and retry")


def _raise_for(reply: _Reply) -> None:
    if reply.error is None:
        return
    kind, where, first, second = reply.error
    if kind == "changed":
        assert isinstance(second, int)
        raise changed_error(where, first, second)
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


__all__ = [
    "O_READ",
    "PROCESS_MIN_FILES",
    "REQUEST_FILES",
    "ProcessPool",
    "can_fork",
    "peek",
    "request_groups",
]
