"""Bind mounts for the CSI node plugin, through the kernel's ``mount(2)``/``umount2(2)``.

Who calls it: :mod:`dsagent.nodeplugins.csi.driver` only. What it owns: the three mount operations
the plugin needs (a read-only bind, an unmount, "is this a mount point") and nothing else.
Decisions: libc through ``ctypes``, not the ``mount`` binary, so the agent image needs no
util-linux and no argument is ever parsed by a shell or a setuid tool; every bind is
remounted ``ro,nosuid,nodev`` (a bind mount ignores ``MS_RDONLY`` on its first call);
mount points are read from ``/proc/self/mountinfo`` (a ``stat`` device comparison misses
a bind of a directory of the same filesystem). Callers validate every path first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

from dsagent.errors import DsagentError

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2


class MountError(DsagentError):
    """A mount or unmount failed; ``errno`` says why (EPERM: the agent lacks CAP_SYS_ADMIN)."""

    code = "mount_failed"

    def __init__(self, message: str, *, errno_value: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, errno=errno_value)
        self.errno = errno_value


_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _libc


def _mount(source: str | None, target: str, flags: int) -> None:
    rc = _lib().mount(source.encode() if source else None, target.encode(), None, flags, None)
    if rc != 0:
        err = ctypes.get_errno()
        hint = (
            "the agent must run privileged (CAP_SYS_ADMIN) to bind datasets into pods" if err == errno.EPERM else None
        )
        raise MountError(f"cannot mount {source or ''} on {target}: {os.strerror(err)}", errno_value=err, hint=hint)


def bind(source: Path, target: Path) -> None:
    """Bind ``source`` on ``target`` as it is (a bind of a read-only mount is read-only)."""
    _mount(str(source), str(target), MS_BIND)


def bind_readonly(source: Path, target: Path) -> None:
    """Bind ``source`` on ``target`` (an existing directory), then make it ro,nosuid,nodev.

    If the remount fails the bind is undone, so a writable bind is never left behind."""
    _mount(str(source), str(target), MS_BIND)
    try:
        _mount(None, str(target), MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except MountError:
        unmount(target)
        raise


def unmount(target: Path) -> None:
    """Unmount ``target``; lazily (``MNT_DETACH``) when it is busy. Not mounted: no-op."""
    for flags in (0, MNT_DETACH):
        if _lib().umount2(str(target).encode(), flags) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more), or gone
            return
        if err != errno.EBUSY:
            raise MountError(f"cannot unmount {target}: {os.strerror(err)}", errno_value=err)
    raise MountError(f"cannot unmount {target}: busy", errno_value=errno.EBUSY)


def mount_points() -> set[str]:
    """Every mount point of this mount namespace (``/proc/self/mountinfo``, unescaped)."""
    points = set()
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            fields = line.split(" ")
            if len(fields) > 4:
                points.add(_unescape(fields[4]))
    return points


def is_mount_point(path: Path) -> bool:
    return str(path) in mount_points()


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 3 < len(text) and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


__all__ = ["MountError", "bind", "bind_readonly", "is_mount_point", "mount_points", "unmount"]
