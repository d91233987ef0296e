"""Durability primitives: what makes a staged write survive a power cut before it is renamed in.

Who calls it: bundle packing and verified extraction (:mod:`dsagent.format.bundle`,
:mod:`dsagent.format.extract`), the agent's fetches and its cache layout (publishing a
version is stage, sync, rename, sync the parent). What it owns: the one ``fsync`` of a
directory's entries and the one ``syncfs`` of a whole filesystem (one call instead of an
``fsync`` per small file; it also flushes other writers on that filesystem, which is the
price of the saving), falling back to ``sync`` where ``syncfs`` is missing.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

__all__ = ["fsync_dir", "syncfs"]
