"""Durability primitives: what makes a staged write survive a power cut before it is renamed in.

Who calls it: bundle packing and verified extraction (:mod:`dsagent.format.bundles.bundle`,
:mod:`dsagent.format.bundles.extract`), the agent's fetches and its cache layout (publishing a
version is stage, sync, rename, sync the parent). What it owns: the one ``fsync`` of a
directory's entries and the one ``syncfs`` of a whole filesystem (one call instead of an
``fsync`` per small file; it also flushes other writers on that filesystem, which is the
price of the saving), falling back to ``sync`` where ``syncfs`` is missing; and the one
atomic small-file write (:func:`write_atomic`: stage, fsync, rename, fsync the directory);
and the paced background writeback of unpacked files (:class:`Writeback`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def fsync(fd: int, path: str | os.PathLike[str]) -> None:
    """``os.fsync(fd)``, its error naming ``path``: the kernel's names no file, and a caller
    tells the cache disk's failure from a source's by the file it names."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc
        raise


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd, path)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all: a temp file beside it (never through a planted
    link), fsync, rename, fsync of the directory. A failure leaves no temp file behind."""
    tmp = path.with_name(f".{path.name}.{os.urandom(16).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            fsync(fh.fileno(), tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


class WritebackError(OSError):
    """Flushing a filesystem failed (EIO, ENOSPC, ...): what was written into it since the
    last good flush may not be on disk. Raised by :func:`syncfs` and by
    :meth:`Writeback.check` for a background flush that failed."""


def syncfs(path: str | os.PathLike[str]) -> None:
    """Flush the filesystem holding ``path`` once (far cheaper than one fsync per small file);
    :class:`WritebackError` when the kernel reports a write error."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if not _syncfs_fd(fd):
            os.sync()
    except WritebackError as exc:
        if exc.filename is None:  # name the filesystem it was (see fsync)
            raise WritebackError(exc.errno, exc.strerror, os.fspath(path)) from exc
        raise
    finally:
        os.close(fd)


@functools.cache
def _syncfs_call() -> Callable[[int], int] | None:
    """``syncfs(fd) -> 0 or the errno``: the native extension's where it is loaded, else the
    C library's through ctypes (loaded on the first ``syncfs``: 2.7 ms of a ``dsctl`` start,
    which the extension spares); None where neither has one (not Linux)."""
    from dsagent.format import native  # here: loaded by every command that writes a tree

    calls = native.system_calls()
    if calls is not None:
        return calls.syncfs
    import ctypes

    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    except OSError:  # pragma: no cover - no libc (not Linux)
        return None
    if fn is None:  # pragma: no cover - a C library without syncfs
        return None

    def call(fd: int) -> int:
        return 0 if fn(fd) == 0 else ctypes.get_errno()

    return call


#: Bytes written into one filesystem between two background flushes (:class:`Writeback`);
#: 0 turns them off (then Linux starts writeback on its own thresholds).
WRITEBACK_STEP = 32 << 20


class Writeback:
    """Starts the writeback of what is written into one filesystem, in large requests.

    Left alone, Linux starts writeback only once dirty pages pass ``dirty_background_ratio``
    (2.4 GB on a 24 GiB node), so a disk receiving a dataset faster than it can write sits
    idle for the first seconds and the final ``syncfs`` then writes everything at once.
    Here, every :data:`WRITEBACK_STEP` bytes reported by :meth:`written` (from every thread
    writing into the filesystem), one ``syncfs`` runs on a background thread, never two at
    once: the disk is busy from the first files on, the final ``syncfs`` only waits for the
    tail, and the kernel's flusher writes many small files' pages in merged requests. This
    replaced a ``sync_file_range`` per file, which sent one request per ~110 kB file:
    10,300 write requests for a 1.08 GB dataset against ~1,000 from ``tar -x`` left to the
    kernel. Paced every 32 MiB, ~2,200 requests of ~510 kB, and caching that dataset took
    3.07-4.81 s (median 3.56 s) against 3.95-5.03 s (median 4.91 s) per file, in six
    interleaved rounds on this project's test VM (64 MiB: median 3.9-4.3 s; docs/performance.md, cache.py).

    One instance per filesystem (:func:`writeback_for`), shared by the threads writing into
    it; it holds no descriptor between flushes (a flush syncs through a copy of the
    descriptor of the file that crossed the step, closed when the flush ends).
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        # a directory of the filesystem, named in the error of a failed flush: the cache
        # disk's, not a source's (the agent tells the two apart by the file an error names)
        self.directory = os.fspath(directory) if directory is not None else None
        self._lock = threading.Lock()
        self._pending = 0
        self._flushing: threading.Thread | None = None
        self._failures = 0  # background flushes that failed, ever
        self._failure: OSError | None = None  # the last one's error

    def written(self, fd: int, nbytes: int) -> None:
        """Report ``nbytes`` more written through ``fd`` (a flush starts every step)."""
        if not WRITEBACK_STEP:
            return
        with self._lock:
            self._pending += nbytes
            if self._pending < WRITEBACK_STEP or self._flushing is not None:
                return
            self._pending = 0
            try:
                handle = os.dup(fd)
            except OSError:  # out of descriptors: writeback is an optimisation, the final syncfs still runs
                return
            flushing = threading.Thread(target=self._flush, args=(handle,), name="dsagent-writeback", daemon=True)
            try:
                flushing.start()
            except RuntimeError:  # no thread to be had: as above
                os.close(handle)
                return
            self._flushing = flushing

    def _flush(self, fd: int) -> None:
        try:
            _syncfs_fd(fd)  # no ``sync`` of every filesystem in its place: the final syncfs decides
        except OSError as exc:
            # kept for :meth:`check`: the kernel reports a writeback error to one syncfs per
            # open file, so the writer's own final syncfs (on a descriptor opened later) may
            # never see it
            with self._lock:
                self._failures += 1
                self._failure = exc
        finally:
            os.close(fd)
            with self._lock:
                self._flushing = None

    def mark(self) -> int:
        """A mark to pass to :meth:`check` later: taken before a writer starts."""
        with self._lock:
            return self._failures

    def check(self, since: int) -> None:
        """Raise :class:`WritebackError` if a background flush failed since ``mark()`` returned
        ``since`` (waiting for the one running now). The filesystem is shared, so the error
        may be another writer's: every writer of that time fails, none publishes."""
        self.wait()
        with self._lock:
            failures, failure = self._failures, self._failure
        if failures != since:
            code = failure.errno if failure is not None and failure.errno else errno.EIO
            raise WritebackError(code, f"a background flush of the filesystem failed: {failure}", self.directory)

    def wait(self) -> None:
        """Wait for the flush running now, if any."""
        with self._lock:
            flushing = self._flushing
        if flushing is not None:
            flushing.join()


_writebacks: dict[int, Writeback] = {}
_writebacks_lock = threading.Lock()


def writeback_for(directory: str | os.PathLike[str]) -> Writeback:
    """The :class:`Writeback` of the filesystem holding ``directory`` (one per filesystem, shared)."""
    device = os.stat(directory).st_dev
    with _writebacks_lock:
        return _writebacks.setdefault(device, Writeback(directory))


def _syncfs_fd(fd: int) -> bool:
    """``syncfs`` of the filesystem holding ``fd``; False where there is none, and
    :class:`WritebackError` where it failed (a write error of the filesystem since this
    descriptor was opened: never taken for success)."""
    call = _syncfs_call()
    if call is None:
        return False
    code = call(fd)
    if code == 0:
        return True
    if code == errno.ENOSYS:  # pragma: no cover - a kernel without syncfs
        return False
    raise WritebackError(code, f"syncfs failed: {os.strerror(code)}")


__all__ = ["WRITEBACK_STEP", "Writeback", "WritebackError", "fsync_dir", "syncfs", "write_atomic", "writeback_for"]
