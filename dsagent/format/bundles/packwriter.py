"""Writing one bundle: a dataset's files read, hashed and laid out as a tar stream, encoded
as zstd frames and stored atomically.

Who calls it: :mod:`dsagent.format.bundles.bundle` (``pack`` and ``write_bundles``, which decide
which bundles to write and in what order). What it owns:

- **plain tar streams** of files already verified (:func:`tar_stream`: what the agent
  sends a node's readers of a striped version);
- **tar headers** for plain members (:func:`tar_header`), packed by hand because
  ``tarfile`` spends ~36 us per header, a sixth of a pack on tmpfs; others go through
  ``tarfile``, and a test checks both give the same bytes;
- **the pipeline of one bundle** (:class:`BundleWriter`, docs/design.md#bundles): a reader
  thread opens, reads and hashes the files into pooled buffers, the calling thread hands
  each full buffer to the frame encoder (:mod:`dsagent.format.bundles.frames`: raw blocks where
  zstd would not shrink them, libzstd elsewhere, on several threads when asked), and a
  write-behind thread writes the frames to the store object
  (:mod:`dsagent.format.bundles.storeobjects`, which makes it appear whole or not at all).
"""

from __future__ import annotations

import copy
import functools
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import xxhash

from dsagent.errors import IntegrityError
from dsagent.format import native as native_loops
from dsagent.format.bundles.storeobjects import CountingWriter
from dsagent.format.hashing import ReadBuffer, read_buffer
from dsagent.format.manifest import (
    CHUNK_SIZE,
    FileEntry,
    Progress,
)
from dsagent.format.oneversion import open_one_version
from dsagent.format.storage import translate_errors
from dsagent.format.tarstream import BLOCK, RECORD, USTAR, USTAR_BASE, USTAR_FIXED, USTAR_LIMIT, USTAR_TAIL
from dsagent.format.walk import is_local

if TYPE_CHECKING:
    from pathlib import Path

    from fsspec.spec import AbstractFileSystem

#: Remote sources: files up to this size are fetched whole, ahead of the writer.
PREFETCH_MAX_FILE = 4 << 20
PREFETCH_FILES = 32
PREFETCH_THREADS = 16
#: Pack pipeline: buffers of ``CHUNK_SIZE`` bytes between a bundle's reader thread and the
#: frame encoder (so at most 8 MiB read ahead per bundle being written), and one more for each
#: buffer an encoder with many threads holds beyond the usual (a frame writer's ``extra_held``).
PIPELINE_BUFFERS = 8
_ZEROS = bytes(2 * RECORD)


def tar_stream(directory: Path, entries: Sequence[FileEntry], chunk: int = 1 << 20) -> Generator[bytes, None, None]:
    """A plain tar of ``entries`` read from ``directory``, headers as bundles have them (what
    the agent streams to a node's readers of a striped version: no zstd, the bytes were
    verified when they arrived). Sizes are the manifest's: a file that changed length cuts
    the stream."""
    root = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for entry in entries:
            yield tar_header(entry)
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=root)
            try:
                left = entry.size
                while left:
                    data = os.read(fd, min(chunk, left))
                    if not data:
                        raise IntegrityError(f"{entry.path} is shorter than its manifest says")
                    left -= len(data)
                    yield data
            finally:
                os.close(fd)
            if entry.size % BLOCK:
                yield b"\0" * (BLOCK - entry.size % BLOCK)
        yield b"\0" * (2 * BLOCK)
    finally:
        os.close(root)


def _tar_header_slow(entry: FileEntry) -> bytes:
    import tarfile  # here: only a path or size a plain header cannot hold goes through tarfile

    info = tarfile.TarInfo(entry.path)
    info.size = entry.size
    info.mtime = entry.mtime_ns // 1_000_000_000
    info.mode = 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def plain_header(entry: FileEntry) -> bool:
    """Whether ``entry``'s header is one plain ustar block: an ASCII path of at most 100
    bytes, a size and an mtime that fit 11 octal digits (else a pax header carries them)."""
    mtime = entry.mtime_ns // 1_000_000_000
    path = entry.path
    return len(path) <= 100 and path.isascii() and 0 <= entry.size < USTAR_LIMIT and 0 <= mtime < USTAR_LIMIT


def tar_header(entry: FileEntry) -> bytes:
    """The tar header(s) of one member, byte for byte what ``tarfile`` writes in PAX_FORMAT.

    Hand-written for the common case (an ASCII path of at most 100 bytes, a size and mtime
    that fit 11 octal digits: one plain ustar block) because ``TarInfo.tobuf`` costs ~36 us
    per file, 0.22 s of a 1.2 s pack of 6,000 files on tmpfs; this costs ~2 us. Anything
    else (long or non-ASCII paths, huge sizes) goes through ``tarfile`` and gets its pax
    header. ``tests/dsagent/format/test_pipeline.py`` checks both give the same bytes.
    """
    if not plain_header(entry):
        return _tar_header_slow(entry)
    mtime = entry.mtime_ns // 1_000_000_000
    name = entry.path.encode("ascii")
    size = b"%011o\0" % entry.size
    stamp = b"%011o\0" % mtime
    checksum = b"%06o\0 " % (USTAR_BASE + sum(name) + sum(size) + sum(stamp))
    return USTAR.pack(name, *USTAR_FIXED, size, stamp, checksum, *USTAR_TAIL)


class _Stopped(Exception):
    """The consumer of a pack pipeline gave up; its reader thread just ends."""


class _TarBuffers:
    """The reader's side of the pack pipeline: the bundle's tar stream, written into pooled buffers.

    Files are read straight into the buffer that will be handed to zstd (one copy from the
    page cache, none in Python), headers and padding are packed around them, and a full
    buffer goes to the ``full`` queue while the reader takes a free one; at most
    :data:`PIPELINE_BUFFERS` buffers exist, so the reader runs at most that far ahead.
    """

    def __init__(self, free: queue.SimpleQueue[ReadBuffer | None], full: queue.SimpleQueue[Any]) -> None:
        self._free = free
        self._full = full
        self.buf = self._take()
        self.view = memoryview(self.buf)
        self.pos = 0

    def _take(self) -> ReadBuffer:
        buf = self._free.get()
        if buf is None:
            raise _Stopped
        return buf

    def flush(self) -> None:
        if self.pos:
            self._full.put((self.buf, self.pos))
            self.buf = self._take()
            self.view = memoryview(self.buf)
            self.pos = 0

    def space(self) -> memoryview:
        """The free tail of the current buffer (a fresh buffer when it is full)."""
        if self.pos == len(self.buf):
            self.flush()
        return self.view[self.pos :]

    def put(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            room = self.space()
            n = min(len(room), len(view))
            room[:n] = view[:n]
            self.pos += n
            view = view[n:]

    def zeros(self, count: int) -> None:
        self.put(_ZEROS[:count] if count <= len(_ZEROS) else bytes(count))


class BundleWriter:
    """Writes one bundle's tar stream into a zstd writer, checking each file's digest.

    Pipelined (docs/design.md#bundles): a reader thread opens, reads and hashes the files
    and lays out the tar stream in pooled buffers (:class:`_TarBuffers`), while the calling
    thread hands each full buffer to zstd, whose own worker threads compress it (``threads``
    in :func:`write_bundles`), and writes the compressed bytes to the store. ``os.readv``,
    xxhash on large chunks and zstd all release the GIL, so on two cores reading, hashing,
    compressing and writing overlap instead of taking turns.
    """

    def __init__(
        self, fs: AbstractFileSystem, root: str, progress: Progress | None, lock: threading.Lock, read_threads: int = 1
    ) -> None:
        self._fs = fs
        self._read_threads = read_threads  # the C reader's threads (native/packloop.c)
        self._root = root.rstrip("/")
        self._local = is_local(fs)
        self._progress = progress
        self._lock = lock
        self._single_file = not fs.isdir(root)  # a lone-file dataset: its one entry is the root

    @property
    def local(self) -> bool:
        return self._local

    def quiet(self) -> BundleWriter:
        """This writer without progress reports (for a forked segment: the parent counts)."""
        twin = copy.copy(self)
        twin._progress = None
        return twin

    def count(self, members: Sequence[FileEntry]) -> None:
        """Report ``members`` as packed (a segment another process packed)."""
        if self._progress is not None:
            with self._lock:
                self._progress(sum(e.size for e in members), len(members))

    def write(self, members: Sequence[FileEntry], out: Any, *, end: bool = True) -> bytes:
        """Write ``members``' tar stream into ``out``; returns their digests as read, 16 raw
        bytes each (the native reader's form: the entry table takes them as they are).

        A member with a digest must still have it (it was digested before); one without
        (the one-pass pack) is hashed as it is read, and must not change while it is.
        """
        digests = bytearray()
        free: queue.SimpleQueue[ReadBuffer | None] = queue.SimpleQueue()
        full: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(PIPELINE_BUFFERS + getattr(out, "extra_held", 0)):
            free.put(read_buffer(CHUNK_SIZE))  # page-aligned: files are read straight into it
        failure: list[BaseException] = []

        def read() -> None:
            try:
                self._fill(members, _TarBuffers(free, full), digests, end)
            except _Stopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
                failure.append(exc)
            finally:
                full.put(None)

        reader = threading.Thread(target=read, name="dsagent-pack-read", daemon=True)
        reader.start()
        try:
            while (item := _next_full(full, free, out)) is not None:
                buf, n = item
                out.write(memoryview(buf)[:n], functools.partial(free.put, buf))  # lent: back once written
        finally:
            free.put(None)  # a reader waiting for a buffer stops
            reader.join()
        if failure:
            raise failure[0]
        return bytes(digests)

    def _fill(self, members: Sequence[FileEntry], tar: _TarBuffers, digests: bytearray, end: bool) -> None:
        if self._local and not self._single_file and native_loops.AVAILABLE:
            self._fill_native(members, tar, digests)
        else:
            self._fill_python(members, tar, digests)
        if end:  # a segment packed by another process (dsagent.format.bundles.packparallel) leaves the end to the last
            tar.zeros(len(_ZEROS))
        tar.flush()

    def _fill_python(self, members: Sequence[FileEntry], tar: _TarBuffers, digests: bytearray) -> None:
        fetched = iter(()) if self._local else self._prefetch(members)
        for entry in members:
            tar.put(tar_header(entry))
            state = xxhash.xxh3_128()
            data = None if self._local else next(fetched)
            if data is not None:
                state.update(data)
                tar.put(data)
                size = len(data)
            elif self._local:
                size = self._read_local(entry, tar, state)
            else:
                size = self._read_remote(entry, tar, state)
            digest = state.digest()
            if entry.digest and (size != entry.size or digest.hex() != entry.digest):
                raise _changed_after_digest(entry)
            if size != entry.size:
                raise _changed_while_packed(entry)
            digests += digest
            if size % BLOCK:
                tar.zeros(BLOCK - size % BLOCK)
            if self._progress is not None:
                with self._lock:
                    self._progress(size, 1)

    def _fill_native(self, members: Sequence[FileEntry], tar: _TarBuffers, digests: bytearray) -> None:
        """:meth:`_fill` by the C reader (``native/packloop.c``, without the GIL): the same
        bytes, digests and errors as the Python loop, a buffer at a time."""
        with translate_errors(f"source directory {self._root!r}"):
            root = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        reader = None
        try:
            reader = native_loops.tar_reader(root, members, tar_header, threads=self._read_threads)
            reported = 0
            while True:
                written, status, index, detail = reader.fill(tar.space())
                tar.pos += written
                finished = reader.next
                if self._progress is not None and finished > reported:
                    with self._lock:
                        self._progress(sum(e.size for e in members[reported:finished]), finished - reported)
                reported = finished
                if status == native_loops.FILL_DONE:
                    break
                if status != native_loops.FILL_MORE:
                    raise _native_failure(members[index], status, detail, self._location(members[index]))
            digests += reader.digests
        finally:
            if reader is not None:
                reader.close()  # its reading threads end here: none outlives the bundle
            os.close(root)

    def _location(self, entry: FileEntry) -> str:
        return self._root if self._single_file else f"{self._root}/{entry.path}"

    def _fetch(self, entry: FileEntry) -> bytes | None:
        if entry.size > PREFETCH_MAX_FILE:
            return None  # streamed in chunks by _read_remote when its turn comes
        with translate_errors(f"source file {self._location(entry)!r}"):
            return bytes(self._fs.cat_file(self._location(entry)))

    def _prefetch(self, members: Sequence[FileEntry]) -> Iterator[bytes | None]:
        """Small remote files fetched ahead, in order, by a few threads: object stores
        answer each GET after a round trip, so one-at-a-time reads would be latency-bound.
        At most ``PREFETCH_FILES`` files (each at most ``PREFETCH_MAX_FILE``) are held."""
        with ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="dsagent-fetch") as pool:
            window: deque[Future[bytes | None]] = deque()
            try:
                for entry in members:
                    window.append(pool.submit(self._fetch, entry))
                    if len(window) >= PREFETCH_FILES:
                        yield window.popleft().result()
                while window:
                    yield window.popleft().result()
            finally:
                for future in window:
                    future.cancel()

    def _read_local(self, entry: FileEntry, tar: _TarBuffers, state: Any) -> int:
        """Read a local file straight into the tar buffers, hashing what was read.

        Asks for one byte more than the file should still hold, so a short read that
        completes the expected size proves the end of the file without another call
        (like :func:`dsagent.format.hashing.hash_fd`); a file that grew reads past its
        size and is reported by the caller. A file read for the first time (no digest
        yet: the one-pass pack) must also still have the size and mtime it was listed
        with once read, so that a rewrite during the pass is an error, not a digest of
        half old, half new bytes.
        """
        location = self._location(entry)
        size = 0
        with translate_errors(f"source file {location!r}"):
            fd = os.open(location, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                while True:
                    room = tar.space()
                    asked = min(len(room), entry.size - size + 1)
                    n = os.readv(fd, [room[:asked]])
                    if not n:
                        break
                    state.update(room[:n])
                    tar.pos += n
                    size += n
                    if size > entry.size or (size == entry.size and n < asked):
                        break
                if not entry.digest:
                    st = os.fstat(fd)
                    if st.st_size != entry.size or st.st_mtime_ns != entry.mtime_ns:
                        raise _changed_while_packed(entry)
            finally:
                os.close(fd)
        return size

    def _read_remote(self, entry: FileEntry, tar: _TarBuffers, state: Any) -> int:
        location = self._location(entry)
        size = 0
        with (
            translate_errors(f"source file {location!r}"),
            open_one_version(self._fs, location, size=entry.size) as stream,
        ):
            while chunk := stream.read(CHUNK_SIZE):
                state.update(chunk)
                tar.put(chunk)
                size += len(chunk)
                if size > entry.size:
                    break
        return size


def _next_full(full: queue.SimpleQueue[Any], free: queue.SimpleQueue[Any], out: Any) -> Any:
    """The reader's next full buffer. While none is ready, the buffers lent to ``out`` and
    still being encoded are handed on (``settle``), the oldest waited for: the reader may be
    waiting for one. While ``out`` keeps a buffer per thread (``deep``: zstd is the slow
    stage) and the reader has a free buffer, only those already encoded go on: waiting for
    the oldest encode then would keep the reader's next buffers from being encoded beside it."""
    settle = getattr(out, "settle", None)
    while settle is not None:
        try:
            return full.get_nowait()
        except queue.Empty:
            if not settle(wait=free.empty() or not out.deep):
                break
    return full.get()


def _native_failure(entry: FileEntry, status: int, detail: int, location: str) -> Exception:
    """The error the Python loop raises where the C reader stopped on ``entry``."""
    if status == native_loops.FILL_ERRNO:
        try:
            with translate_errors(f"source file {location!r}"):
                raise OSError(detail, os.strerror(detail), location)
        except Exception as exc:  # noqa: BLE001 - the translated error, raised by the caller
            return exc
    if status == native_loops.FILL_DIGEST:
        return _changed_after_digest(entry)
    return _changed_while_packed(entry)


def _changed_after_digest(entry: FileEntry) -> IntegrityError:
    return IntegrityError(f"{entry.path!r} changed after it was digested", hint="pack again once the source is quiet")


def _changed_while_packed(entry: FileEntry) -> IntegrityError:
    return IntegrityError(f"{entry.path!r} changed while it was packed", hint="pack again once the source is quiet")


class WriteBehind:
    """The store-writing stage of the pack pipeline: zstd's output written by its own thread.

    zstd hands each compressed block over as a new ``bytes``; a thread writes them to the
    store object in order while the next block is compressed. At most
    :data:`PIPELINE_BUFFERS` blocks wait. A write error is raised by the next ``write`` or
    at the end, and the thread is always joined before the object is synced or removed.
    """

    def __init__(self, raw: CountingWriter) -> None:
        self._raw = raw
        self._blocks: queue.Queue[Any] = queue.Queue(PIPELINE_BUFFERS)
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="dsagent-pack-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._blocks.get()) is not None:
            pieces, release = item
            if not self._failure:
                try:
                    if isinstance(pieces, bytes):
                        self._raw.write(pieces)
                    else:
                        self._raw.writev(pieces)
                except BaseException as exc:  # noqa: BLE001 - raised by the next write or by close()
                    self._failure.append(exc)
            if release is not None:
                release()  # the lender's buffer is free again once its views are written (or dropped)

    def write(self, data: bytes) -> int:
        if self._failure:
            raise self._failure[0]
        self._blocks.put((data, None))
        return len(data)

    def gather(self, pieces: Sequence[bytes | memoryview], release: Callable[[], object] | None) -> None:
        """Write ``pieces`` (views of a lent buffer among them) in order, then call ``release``."""
        if self._failure:
            raise self._failure[0]
        self._blocks.put((pieces, release))

    def flush(self) -> None:
        pass  # the store object is flushed and synced by store_object once this stage ended

    def close_quietly(self) -> None:
        """End the stage after a failure elsewhere: blocks still queued are dropped."""
        if not self._failure:
            self._failure.append(_Stopped())
        if self._thread.is_alive():
            self._blocks.put(None)
            self._thread.join()

    def close(self) -> None:
        """Wait for every block to be written; raise the first write error."""
        if self._thread.is_alive():
            self._blocks.put(None)
            self._thread.join()
        if self._failure:
            raise self._failure[0]
