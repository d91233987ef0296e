"""Which files of a tree anyone opens, as the kernel tells it (inotify ``IN_OPEN``).

A test that asks whether a file was read cannot count Python's own opens: the native loops
open files in C. inotify reports every open of a file in a watched directory, whoever makes
it, on tmpfs as on a disk. Linux only (the tests that use it run where the agent runs).
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
from pathlib import Path
from types import TracebackType

IN_OPEN = 0x00000020
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name

_libc = ctypes.CDLL(None, use_errno=True)


class OpenWatch:
    """The files opened under ``root`` (every directory below it watched) while in the ``with``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.opened: set[str] = set()
        self._fd = -1
        self._dirs: dict[int, str] = {}

    def __enter__(self) -> OpenWatch:
        self._fd = _libc.inotify_init1(IN_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        for directory, _, _ in os.walk(self.root):
            wd = _libc.inotify_add_watch(self._fd, os.fsencode(directory), IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), "inotify_add_watch", directory)
            self._dirs[wd] = os.path.relpath(directory, self.root)
        return self

    def _drain(self) -> None:
        while select.select([self._fd], [], [], 0)[0]:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            at = 0
            while at < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + length].rstrip(b"\0").decode()
                at += _EVENT.size + length
                if mask & IN_ISDIR or not name:  # a directory opened (listed), not a file
                    continue
                where = self._dirs.get(wd)
                if where is not None:
                    self.opened.add(name if where == "." else f"{where}/{name}")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._drain()
        finally:
            os.close(self._fd)
