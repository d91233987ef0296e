"""Durability primitives: what makes a staged write survive a power cut before it is renamed in.

Who calls it: bundle packing and verified extraction (:mod:`dsagent.format.bundle`,
:mod:`dsagent.format.extract`), the agent's fetches and its cache layout (publishing a
version is stage, sync, rename, sync the parent). What it owns: the one ``fsync`` of a
directory's entries and the one ``syncfs`` of a whole filesystem (one call instead of an
``fsync`` per small file; it also flushes other writers on that filesystem, which is the
price of the saving), falling back to ``sync`` where ``syncfs`` is missing; and the one
atomic small-file write (:func:`write_atomic`: stage, fsync, rename, fsync the directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import uuid
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all: a temp file beside it (never through a planted
    link), fsync, rename, fsync of the directory. A failure leaves no temp file behind."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def syncfs(path: str | os.PathLike[str]) -> None:
    """Flush the filesystem holding ``path`` once (far cheaper than one fsync per small file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fn = getattr(_LIBC, "syncfs", None) if _LIBC is not None else None
        if fn is None or fn(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _load_libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no libc (not Linux)
        return None


_LIBC = _load_libc()
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of the range's dirty pages, do not wait
_sync_file_range = getattr(_LIBC, "sync_file_range", None) if _LIBC is not None else None
if _sync_file_range is not None:
    _sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)

#: Start each unpacked file's writeback as soon as it is written (docs/design.md#bundles).
EARLY_WRITEBACK = True


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now, without waiting for them.

    Left alone, Linux starts writeback only once dirty pages pass ``dirty_background_ratio``
    (2.4 GB on a 24 GiB node), so a disk receiving a dataset faster than it can write sits
    idle for the first seconds and the final ``syncfs`` then writes everything at once.
    Started per file, the disk is busy from the first file on and the final ``syncfs``
    only waits for the tail. A no-op where there is no such call or no writeback (tmpfs).
    """
    if EARLY_WRITEBACK and _sync_file_range is not None:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


__all__ = ["EARLY_WRITEBACK", "fsync_dir", "start_writeback", "syncfs", "write_atomic"]
