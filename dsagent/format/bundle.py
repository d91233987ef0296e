"""Bundles: a dataset's files packed into a few large tar+zstd objects in a bundle store.

Who calls it: ``dsctl pack / unpack`` and the agent (which fetches bundles one by one
with :func:`unpack_bundle`, re-exported here from :mod:`dsagent.format.extract`).

What it owns:

- **where bundles begin and end** (:func:`plan_bundles`, pure): content-defined on path
  hashes, so that one added, removed or changed file rewrites at most two bundles (the
  exact guarantee is in that function's docstring);
- **writing them** (:func:`pack`, :func:`write_bundles`): a POSIX tar (pax headers for
  long or non-ASCII names) compressed by zstd, named ``bundles/<digest>.tar.zst`` by the
  digest of its members, skipped when the store already holds it. One bundle is written
  by a pipeline (reader thread, zstd, write-behind thread: :class:`_BundleWriter`,
  docs/design.md#bundles); several bundles are written in parallel, one per core;
- **tar headers** for plain members (:func:`tar_header`), packed by hand because
  ``tarfile`` spends ~36 us per header, a sixth of a pack on tmpfs; others go through
  ``tarfile``, and a test checks both give the same bytes;
- **the store's write order**: bundles first, the manifest last, each atomically (temp,
  fsync, rename on local disks; one PUT on object stores), so a reader never sees a
  manifest whose bundles are missing.
"""

from __future__ import annotations

import errno
import os
import queue
import tarfile
import threading
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

import xxhash
import zstandard

from dsagent.errors import InsufficientSpace, IntegrityError, InvalidInput
from dsagent.format.digestcache import DigestCache
from dsagent.format.digester import build_manifest, is_local, list_files
from dsagent.format.durable import fsync_dir
from dsagent.format.extract import (
    create_empty_directories,
    unpack,
    unpack_bundle,
    verify_tree,
)
from dsagent.format.manifest import (
    BUNDLES_DIR,
    CHUNK_SIZE,
    BundleRef,
    FileEntry,
    Manifest,
    Progress,
    bundle_digest,
    bundle_path,
    check_dataset_name,
    check_layout,
    manifest_path,
)
from dsagent.format.storage import open_whole, resolve_local_first, translate_errors
from dsagent.format.tarstream import USTAR, USTAR_BASE, USTAR_FIXED, USTAR_LIMIT, USTAR_TAIL

if TYPE_CHECKING:
    from fsspec.spec import AbstractFileSystem

DEFAULT_MAX_FILES = 50_000
DEFAULT_MAX_BYTES = 800_000_000
#: zstd level 1: JPEG-like payloads do not compress, so the fastest level loses nothing.
DEFAULT_LEVEL = 1
#: Remote sources: files up to this size are fetched whole, ahead of the writer.
PREFETCH_MAX_FILE = 4 << 20
PREFETCH_FILES = 32
PREFETCH_THREADS = 16
#: Pack pipeline: buffers of ``CHUNK_SIZE`` bytes between a bundle's reader thread and zstd
#: (so at most 8 MiB read ahead per bundle being written).
PIPELINE_BUFFERS = 8
_BLOCK = tarfile.BLOCKSIZE
_ZEROS = bytes(2 * tarfile.RECORDSIZE)


# --------------------------------------------------------------------------- boundaries


def _gap_priorities(entries: Sequence[FileEntry]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(entry.path.encode("utf-8", "surrogateescape")) for entry in entries[:-1]]


def plan_bundles(
    entries: Sequence[FileEntry], max_files: int = DEFAULT_MAX_FILES, max_bytes: int = DEFAULT_MAX_BYTES
) -> list[tuple[int, int]]:
    """``(first, count)`` ranges that split ``entries`` (in path order) into bundles.

    Scheme: each gap between two neighbouring entries gets a priority, the 64-bit xxh3 of
    the path before it, so it depends on that one path and nothing else. The gaps form a
    Cartesian tree (min-heap on priority); a gap's *domain* is the run of entries between
    the nearest gaps of smaller priority on either side. A gap is a boundary exactly when
    its domain holds more than ``max_files`` files or more than ``max_bytes`` bytes. So:

    - every bundle respects both caps, or is a single file larger than ``max_bytes``
      (the lowest-priority gap inside a bundle is not a boundary, and its domain is
      exactly that bundle);
    - a dataset under both caps is one bundle;
    - boundaries depend on paths and sizes only, never on contents, so changing a file's
      content (same size) rewrites exactly one bundle;
    - an edit only moves boundaries whose domain contains the edited file, or its own gap.
      Adding a file (no larger than the dataset's smallest file, e.g. any file when the
      count cap binds) rewrites at most two bundles; removing a file that is not the
      last of its bundle rewrites exactly one. Both hold for every input (tested over
      thousands of random datasets with binding caps).

    Where the bound does not hold: removing the *last* file of a bundle removes a
    boundary, and the gaps around it may then all have domains over a cap, so the merged
    region is re-split: usually one or two bundles, occasionally more. The same goes
    for adding a file larger than the smallest one, or resizing a file, when that
    pushes several nested domains over ``max_bytes`` at once (a file larger than
    ``max_bytes`` added in the middle of a bundle necessarily leaves three: the run
    before it, itself, the run after). At realistic scale (hundreds of files per bundle)
    this is about one edit in several hundred, and the tests check random edits of
    every kind there stay within two bundles.
    """
    if max_files < 1 or max_bytes < 1:
        raise InvalidInput("max_files and max_bytes must be at least 1")
    n = len(entries)
    if n == 0:
        return []
    prefix = [0] * (n + 1)
    for i, entry in enumerate(entries):
        prefix[i + 1] = prefix[i] + entry.size
    priority = _gap_priorities(entries)
    gaps = n - 1
    left = _nearest_smaller(priority, range(gaps), strict=False, none=-1)
    right = _nearest_smaller(priority, range(gaps - 1, -1, -1), strict=True, none=n - 1)
    cuts = [
        g for g in range(gaps)
        if right[g] - left[g] > max_files or prefix[right[g] + 1] - prefix[left[g] + 1] > max_bytes
    ]  # fmt: skip
    bounds = [-1, *cuts, n - 1]
    return [(bounds[i] + 1, bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]


def _nearest_smaller(priority: Sequence[int], order: range, *, strict: bool, none: int) -> list[int]:
    """For each gap, the nearest gap in the direction already walked with a smaller priority.

    Ties are broken by position (strict on one side, non-strict on the other) so the tree
    is well defined even if two paths share a 64-bit hash.
    """
    result = [none] * len(priority)
    stack: list[int] = []
    for g in order:
        p = priority[g]
        if strict:
            while stack and priority[stack[-1]] >= p:
                stack.pop()
        else:
            while stack and priority[stack[-1]] > p:
                stack.pop()
        result[g] = stack[-1] if stack else none
        stack.append(g)
    return result


# --------------------------------------------------------------------------- writing


class _CountingWriter:
    """Counts the compressed bytes zstd writes into the store object."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.written = 0

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


def _tar_header_slow(entry: FileEntry) -> bytes:
    info = tarfile.TarInfo(entry.path)
    info.size = entry.size
    info.mtime = entry.mtime_ns // 1_000_000_000
    info.mode = 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_header(entry: FileEntry) -> bytes:
    """The tar header(s) of one member, byte for byte what ``tarfile`` writes in PAX_FORMAT.

    Hand-written for the common case (an ASCII path of at most 100 bytes, a size and mtime
    that fit 11 octal digits: one plain ustar block) because ``TarInfo.tobuf`` costs ~36 us
    per file, 0.22 s of a 1.2 s pack of 6,000 files on tmpfs; this costs ~2 us. Anything
    else (long or non-ASCII paths, huge sizes) goes through ``tarfile`` and gets its pax
    header. ``tests/dsagent/test_bundle.py`` checks both give the same bytes.
    """
    path = entry.path
    mtime = entry.mtime_ns // 1_000_000_000
    if len(path) > 100 or not path.isascii() or not 0 <= entry.size < USTAR_LIMIT or not 0 <= mtime < USTAR_LIMIT:
        return _tar_header_slow(entry)
    name = path.encode("ascii")
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

    def __init__(self, free: queue.SimpleQueue[bytearray | None], full: queue.SimpleQueue[Any]) -> None:
        self._free = free
        self._full = full
        self.buf = self._take()
        self.view = memoryview(self.buf)
        self.pos = 0

    def _take(self) -> bytearray:
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


class _BundleWriter:
    """Writes one bundle's tar stream into a zstd writer, checking each file's digest.

    Pipelined (docs/design.md#bundles): a reader thread opens, reads and hashes the files
    and lays out the tar stream in pooled buffers (:class:`_TarBuffers`), while the calling
    thread hands each full buffer to zstd, whose own worker threads compress it (``threads``
    in :func:`write_bundles`), and writes the compressed bytes to the store. ``os.readv``,
    xxhash on large chunks and zstd all release the GIL, so on two cores reading, hashing,
    compressing and writing overlap instead of taking turns.
    """

    def __init__(self, fs: AbstractFileSystem, root: str, progress: Progress | None, lock: threading.Lock) -> None:
        self._fs = fs
        self._root = root.rstrip("/")
        self._local = is_local(fs)
        self._progress = progress
        self._lock = lock
        self._single_file = not fs.isdir(root)  # a lone-file dataset: its one entry is the root

    def write(self, members: Sequence[FileEntry], out: Any) -> list[str]:
        """Write ``members``' tar stream into ``out``; returns their digests as read.

        A member with a digest must still have it (it was digested before); one without
        (the one-pass pack) is hashed as it is read, and must not change while it is.
        """
        digests: list[str] = []
        free: queue.SimpleQueue[bytearray | None] = queue.SimpleQueue()
        full: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(PIPELINE_BUFFERS):
            free.put(bytearray(CHUNK_SIZE))
        failure: list[BaseException] = []

        def read() -> None:
            try:
                self._fill(members, _TarBuffers(free, full), digests)
            except _Stopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
                failure.append(exc)
            finally:
                full.put(None)

        reader = threading.Thread(target=read, name="dsagent-pack-read", daemon=True)
        reader.start()
        try:
            while (item := full.get()) is not None:
                buf, n = item
                out.write(memoryview(buf)[:n])
                free.put(buf)
        finally:
            free.put(None)  # a reader waiting for a buffer stops
            reader.join()
        if failure:
            raise failure[0]
        return digests

    def _fill(self, members: Sequence[FileEntry], tar: _TarBuffers, digests: list[str]) -> None:
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
            digest = state.hexdigest()
            if entry.digest and (size != entry.size or digest != entry.digest):
                raise IntegrityError(
                    f"{entry.path!r} changed after it was digested", hint="pack again once the source is quiet"
                )
            if size != entry.size:
                raise _changed_while_packed(entry)
            digests.append(digest)
            if size % _BLOCK:
                tar.zeros(_BLOCK - size % _BLOCK)
            if self._progress is not None:
                with self._lock:
                    self._progress(size, 1)
        tar.zeros(len(_ZEROS))
        tar.flush()

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
        with translate_errors(f"source file {location!r}"), open_whole(self._fs, location, size=entry.size) as stream:
            while chunk := stream.read(CHUNK_SIZE):
                state.update(chunk)
                tar.put(chunk)
                size += len(chunk)
                if size > entry.size:
                    break
        return size


def _write_synced(tmp: str, fill: Any, what: str) -> int:
    """Write the new local file ``tmp`` with ``fill(stream)`` and fsync it; removed again on failure."""
    try:
        with open(tmp, "xb") as raw:
            counter = _CountingWriter(raw)
            fill(counter)
            raw.flush()
            os.fsync(raw.fileno())
    except BaseException as exc:
        _remove_temporary(tmp)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientSpace(
                f"no space left in the bundle store for {what}: {exc}", hint="free space in the store"
            ) from exc
        raise
    return counter.written


def _remove_temporary(tmp: str) -> None:
    with translate_errors(f"temporary {tmp!r}"):
        if os.path.exists(tmp):
            os.unlink(tmp)


def _changed_while_packed(entry: FileEntry) -> IntegrityError:
    return IntegrityError(f"{entry.path!r} changed while it was packed", hint="pack again once the source is quiet")


def _store_object(fs: AbstractFileSystem, path: str, fill: Any) -> int:
    """Write one object atomically with ``fill(stream)``; the number of bytes written."""
    if is_local(fs):
        directory, _, base = path.rpartition("/")
        tmp = f"{directory}/.{base}.{uuid.uuid4().hex}.tmp"
        written = _write_synced(tmp, fill, base)
        try:
            os.replace(tmp, path)
        except BaseException:
            _remove_temporary(tmp)
            raise
        fsync_dir(directory)
        return written
    with fs.open(path, "wb") as raw:  # object stores publish an object only on a completed close
        counter = _CountingWriter(raw)
        fill(counter)
    return counter.written


class _WriteBehind:
    """The store-writing stage of the pack pipeline: zstd's output written by its own thread.

    zstd hands each compressed block over as a new ``bytes``; a thread writes them to the
    store object in order while the next block is compressed. At most
    :data:`PIPELINE_BUFFERS` blocks wait. A write error is raised by the next ``write`` or
    at the end, and the thread is always joined before the object is synced or removed.
    """

    def __init__(self, raw: _CountingWriter) -> None:
        self._raw = raw
        self._blocks: queue.Queue[bytes | None] = queue.Queue(PIPELINE_BUFFERS)
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="dsagent-pack-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (block := self._blocks.get()) is not None:
            if not self._failure:
                try:
                    self._raw.write(block)
                except BaseException as exc:  # noqa: BLE001 - raised by the next write or by close()
                    self._failure.append(exc)

    def write(self, data: bytes) -> int:
        if self._failure:
            raise self._failure[0]
        self._blocks.put(data)
        return len(data)

    def flush(self) -> None:
        pass  # the store object is flushed and synced by _store_object once this stage ended

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


def _compress_into(members: Sequence[FileEntry], writer: _BundleWriter, level: int, threads: int) -> Any:
    """``fill(raw)``: the bundle of ``members`` compressed into ``raw``; returns their digests."""

    def fill(raw: _CountingWriter) -> list[str]:
        compressor = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)
        behind = _WriteBehind(raw)
        try:
            with compressor.stream_writer(behind, closefd=False, write_size=CHUNK_SIZE) as out:  # type: ignore[arg-type]
                digests = writer.write(members, out)
        except BaseException:
            behind.close_quietly()
            raise
        behind.close()
        return digests

    return fill


def _store_new_bundle(
    fs: AbstractFileSystem, root: str, members: Sequence[FileEntry], fill: Any
) -> tuple[str, int, list[str], bool]:
    """Write a bundle whose name is known only once it is written (the one-pass pack).

    ``fill`` writes into a temporary object in ``bundles/`` and returns the members'
    digests; the object is then renamed to ``bundles/<bundle digest>.tar.zst``, or dropped
    when the store already holds that bundle (same members, same bytes: the one there is
    kept, as :func:`write_bundles` keeps it). Local stores: fsync, rename, fsync of the
    directory, as :func:`_store_object`; object stores: one PUT of the temporary object and
    a server-side move. Returns ``(bundle digest, stored size, member digests, whether it
    was new to the store)``.
    """
    directory = f"{root.rstrip('/')}/{BUNDLES_DIR}"
    tmp = f"{directory}/.pack-{uuid.uuid4().hex}.tmp"
    digests: list[str] = []

    def record(raw: _CountingWriter) -> None:
        digests.extend(fill(raw))

    if is_local(fs):
        size = _write_synced(tmp, record, "a new bundle")
        try:
            digest = bundle_digest(_named(members, digests))
            path = bundle_path(root, digest)
            new = not os.path.exists(path)
            if new:
                os.replace(tmp, path)
                fsync_dir(directory)
            else:
                os.unlink(tmp)
        except BaseException:
            _remove_temporary(tmp)
            raise
        return digest, size, digests, new
    try:
        size = _store_object(fs, tmp, record)
        digest = bundle_digest(_named(members, digests))
        path = bundle_path(root, digest)
        new = _stored_size(fs, path) is None
        if new:
            fs.mv(tmp, path)
        else:
            fs.rm(tmp)
    except BaseException:
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except Exception:  # noqa: BLE001 - the first failure is the one to report
            pass
        raise
    return digest, size, digests, new


def _named(members: Sequence[FileEntry], digests: Sequence[str]) -> list[FileEntry]:
    """``members`` with the digests read while packing them."""
    return [FileEntry(e.path, e.size, e.mtime_ns, d) for e, d in zip(members, digests, strict=True)]


def _stored_size(fs: AbstractFileSystem, path: str) -> int | None:
    """The size of a stored object, or None when it is absent (one round trip)."""
    try:
        return int(fs.size(path))
    except FileNotFoundError:
        return None


def write_bundles(
    manifest: Manifest,
    source: str | os.PathLike[str],
    store: str | os.PathLike[str],
    *,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store_options: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> tuple[Manifest, int]:
    """Write ``manifest``'s bundles (those the store lacks) and then the manifest.

    Returns the manifest with its bundle index and the number of bundles reused.
    ``progress(bytes, files)`` counts the files packed (reused bundles count at once).
    """
    src_fs, src_root = resolve_local_first(source, storage_options)
    dst_fs, dst_root = resolve_local_first(store, store_options)
    plan = plan_bundles(manifest.entries, max_files, max_bytes)
    groups = [manifest.entries[first : first + count] for first, count in plan]
    digests = [bundle_digest(group) for group in groups]
    with translate_errors(f"bundle store {os.fspath(store)!r}"):
        _prepare_directory(dst_fs, f"{dst_root.rstrip('/')}/{BUNDLES_DIR}")
        existing = {
            digest: size
            for digest in set(digests)
            if (size := _stored_size(dst_fs, bundle_path(dst_root, digest))) is not None
        }
    todo = [i for i, digest in enumerate(digests) if digest not in existing]
    if progress is not None:
        reused = [g for g, d in zip(groups, digests) if d in existing]
        if reused:
            progress(sum(e.size for g in reused for e in g), sum(len(g) for g in reused))
    cpus = os.cpu_count() or 1
    parallel = max(1, min(len(todo), cpus))
    zstd_threads = threads if threads is not None else (cpus if parallel == 1 and cpus > 1 else 0)
    writer = _BundleWriter(src_fs, src_root, progress, threading.Lock())
    sizes = dict(existing)

    def write_one(i: int) -> None:
        path = bundle_path(dst_root, digests[i])
        with translate_errors(f"bundle {digests[i]} in {os.fspath(store)!r}"):
            sizes[digests[i]] = _store_object(dst_fs, path, _compress_into(groups[i], writer, level, zstd_threads))

    if parallel == 1:
        for i in todo:
            write_one(i)
    else:
        with ThreadPoolExecutor(parallel, thread_name_prefix="dsagent-pack") as pool:
            list(pool.map(write_one, todo))
    refs = [
        BundleRef(digest, first, count, sum(e.size for e in group), sizes[digest])
        for (first, count), group, digest in zip(plan, groups, digests)
    ]  # fmt: skip
    packed = manifest.with_bundles(refs)
    write_manifest(packed, store, store_options=store_options)
    packed = _keep_reused(packed, set(existing), src_fs, src_root, dst_fs, dst_root, store, level, store_options)
    return packed, len(plan) - len(todo)


def _keep_reused(
    packed: Manifest,
    reused: set[str],
    src_fs: AbstractFileSystem,
    src_root: str,
    dst_fs: AbstractFileSystem,
    dst_root: str,
    store: str | os.PathLike[str],
    level: int,
    store_options: Mapping[str, Any] | None,
) -> Manifest:
    """After the manifest, check once more that the bundles this pack reused (rather than
    wrote) are still in the store: a concurrent ``dsctl gc`` may have moved an old orphan
    aside between this pack's look and its manifest (docs/design.md#store-gc). One missing
    is written again from the source (each file's digest checked), and the manifest again
    when its compressed size changed. One size request per reused bundle."""
    refs = list(packed.bundles)
    changed = False
    writer = _BundleWriter(src_fs, src_root, None, threading.Lock())
    for k, ref in enumerate(refs):
        if ref.digest not in reused:
            continue
        path = bundle_path(dst_root, ref.digest)
        with translate_errors(f"bundle {ref.digest} in {os.fspath(store)!r}"):
            if _stored_size(dst_fs, path) is not None:
                continue
            members = packed.entries[ref.first : ref.first + ref.count]
            size = _store_object(dst_fs, path, _compress_into(members, writer, level, 0))
        if size != ref.compressed_size:
            refs[k] = BundleRef(ref.digest, ref.first, ref.count, ref.size, size)
            changed = True
    if changed:
        packed = packed.with_bundles(refs)
        write_manifest(packed, store, store_options=store_options)
    return packed


def write_manifest(
    manifest: Manifest, store: str | os.PathLike[str], *, store_options: Mapping[str, Any] | None = None
) -> None:
    """Store ``manifest`` as ``<store>/<name>/manifest``, atomically; call it after its bundles."""
    fs, root = resolve_local_first(store, store_options)
    path = manifest_path(root, manifest.name)
    data = manifest.to_bytes()
    with translate_errors(f"manifest of {manifest.name!r} in {os.fspath(store)!r}"):
        _prepare_directory(fs, path.rpartition("/")[0])
        _store_object(fs, path, lambda raw: raw.write(data))


#: Filesystems whose first path component is a bucket (container): ``mkdir`` there creates
#: one, so packing into a mistyped bucket would silently create it.
_BUCKET_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "cos"}


def _prepare_directory(fs: Any, directory: str) -> None:
    """Create ``directory`` where directories exist; on object stores check that the bucket
    exists instead, and never create it (a missing bucket is :class:`NotFound`)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & _BUCKET_PROTOCOLS:
        fs.makedirs(directory, exist_ok=True)
        return
    bucket = fs._strip_protocol(directory).strip("/").split("/", 1)[0]
    try:
        fs.info(bucket)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"bucket {bucket!r} does not exist (create it first: packing never creates buckets)"
        ) from exc


def pack(
    source: str | os.PathLike[str],
    store: str | os.PathLike[str],
    *,
    name: str,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store_options: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    digest_cache: DigestCache | None = None,
    workers: int | None = None,
) -> Manifest:
    """Digest ``source`` and pack it into ``store`` as dataset ``name``; returns the manifest.

    :func:`pack_dataset` without the count of reused bundles.
    """
    packed, _ = pack_dataset(
        source, store, name=name, max_files=max_files, max_bytes=max_bytes, level=level, threads=threads,
        storage_options=storage_options, store_options=store_options, progress=progress, digest_cache=digest_cache,
        workers=workers,
    )  # fmt: skip
    return packed


def pack_dataset(
    source: str | os.PathLike[str],
    store: str | os.PathLike[str],
    *,
    name: str,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store_options: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    digest_cache: DigestCache | None = None,
    workers: int | None = None,
) -> tuple[Manifest, int]:
    """Pack ``source`` into ``store`` as dataset ``name``: the manifest and the number of bundles reused.

    A local source is packed in one pass (docs/design.md#bundles): the tree is listed and
    stat'ed, bundles are planned from paths and sizes (:func:`plan_bundles` needs no
    digests), and each file is read once, hashed while its bytes go into its bundle; the
    manifest is built from those hashes. A file whose size or mtime moves while it is
    read is an error (:class:`IntegrityError`), as it was between the two passes. With
    ``digest_cache``, a bundle whose files all have cached digests (unchanged size, mtime,
    inode, ctime) and which the store already holds is reused without reading a byte; its
    other bundles are written into a temporary object and named once written (a bundle the
    store turns out to hold is dropped, not replaced). Files hashed while packing go into
    the cache.

    Other sources are digested first and then packed (:func:`write_bundles`): re-packing
    an unchanged remote source in one pass would upload every bundle again only to find
    that the store holds it, and remote sources have no digest cache to avoid that.
    ``threads`` is zstd's worker count per bundle (default: all cores when one bundle is
    written at a time, else bundles are written in parallel, one per core).
    """
    check_dataset_name(name)
    src_fs, src_root = resolve_local_first(source, storage_options)
    empty: list[str] = []
    files = None
    if is_local(src_fs):
        with translate_errors(f"source {os.fspath(source)!r}"):
            files = list_files(src_fs, src_root, empty)
    if files is None:
        manifest = build_manifest(
            source, name=name, storage_options=storage_options, workers=workers, digest_cache=digest_cache
        )
        return write_bundles(
            manifest, source, store, max_files=max_files, max_bytes=max_bytes, level=level, threads=threads,
            storage_options=storage_options, store_options=store_options, progress=progress,
        )  # fmt: skip
    listed = [FileEntry(f.path, f.size, f.mtime_ns, "") for f in files]
    check_layout([e.path for e in listed], sorted(set(empty)))  # before any bundle is written
    snapshot = digest_cache.snapshot(src_root) if digest_cache is not None else {}
    known: list[str | None] = (
        [digest_cache.match(snapshot, f) for f in files] if digest_cache is not None else [None] * len(files)
    )
    plan = plan_bundles(listed, max_files, max_bytes)
    dst_fs, dst_root = resolve_local_first(store, store_options)
    digests: list[str | None] = []
    for first, count in plan:
        cached = known[first : first + count]
        digests.append(None if None in cached else bundle_digest(_named(listed[first : first + count], cached)))  # type: ignore[arg-type]
    with translate_errors(f"bundle store {os.fspath(store)!r}"):
        _prepare_directory(dst_fs, f"{dst_root.rstrip('/')}/{BUNDLES_DIR}")
        sizes = {
            digest: size
            for digest in digests
            if digest is not None and (size := _stored_size(dst_fs, bundle_path(dst_root, digest))) is not None
        }
    todo = [i for i, digest in enumerate(digests) if digest not in sizes]
    if progress is not None and len(todo) < len(plan):
        writing = set(todo)
        reused = [plan[i] for i in range(len(plan)) if i not in writing]
        progress(
            sum(e.size for first, count in reused for e in listed[first : first + count]), sum(c for _, c in reused)
        )
    cpus = os.cpu_count() or 1
    parallel = max(1, min(len(todo), cpus))
    zstd_threads = threads if threads is not None else (cpus if parallel == 1 and cpus > 1 else 0)
    writer = _BundleWriter(src_fs, src_root, progress, threading.Lock())
    written: list[int] = []  # bundles the store did not hold (one packed again but found there is reused)

    def write_one(i: int) -> None:
        first, count = plan[i]
        members = listed[first : first + count]
        with translate_errors(f"a new bundle in {os.fspath(store)!r}"):
            digest, size, read, new = _store_new_bundle(
                dst_fs, dst_root, members, _compress_into(members, writer, level, zstd_threads)
            )
        digests[i] = digest
        sizes[digest] = size
        known[first : first + count] = read
        if new:
            written.append(i)

    if parallel == 1:
        for i in todo:
            write_one(i)
    else:
        with ThreadPoolExecutor(parallel, thread_name_prefix="dsagent-pack") as pool:
            list(pool.map(write_one, todo))
    entries = [FileEntry(e.path, e.size, e.mtime_ns, d) for e, d in zip(listed, known)]  # type: ignore[arg-type]
    refs = []
    for (first, count), digest in zip(plan, digests):
        assert digest is not None
        refs.append(BundleRef(digest, first, count, sum(e.size for e in listed[first : first + count]), sizes[digest]))
    packed = Manifest.create(name, entries, directories=empty, bundles=refs)
    write_manifest(packed, store, store_options=store_options)
    kept = {digests[i] for i in range(len(plan)) if i not in set(written)}
    packed = _keep_reused(packed, kept, src_fs, src_root, dst_fs, dst_root, store, level, store_options)  # type: ignore[arg-type]
    if digest_cache is not None:
        fresh = [(files[k], known[k]) for i in todo for k in range(plan[i][0], plan[i][0] + plan[i][1])]
        digest_cache.record(hits=len(files) - len(fresh), misses=len(fresh))
        digest_cache.store(fresh)  # type: ignore[arg-type]
    return packed, len(plan) - len(written)


__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "create_empty_directories",
    "pack",
    "pack_dataset",
    "plan_bundles",
    "tar_header",
    "unpack",
    "unpack_bundle",
    "verify_tree",
    "write_bundles",
    "write_manifest",
]
