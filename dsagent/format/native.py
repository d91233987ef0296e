"""The optional native loops: ``dsagent.format._native``, a C extension built only by ``make native``.

Who calls it: the digest (:func:`dsagent.format.digester.digest_files`), which hashes a
local tree with :func:`hash_names` on threads when the extension is here, and with its
pure-Python loops on forked processes otherwise (same manifest either way; the tests hold
the two paths equal). What it owns: whether the extension is importable (:data:`AVAILABLE`)
and the call that turns one directory's names into the digest's columns.

Why C at all, and why optional: the pure-Python digest spends ~15 us of interpreter work per
file under the GIL, so it needs one process per core, pickled replies and a serial merge; the
C loop opens, stats, reads and hashes a whole group of files with the GIL released, so plain
threads use every core (figures and the decision: docs/design-native.md). ``pip install``
never compiles anything, so a machine without a compiler installs and runs the pure path.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from dsagent.errors import IntegrityError
from dsagent.format.storage import translate_errors

try:
    from dsagent.format import _native  # type: ignore[attr-defined]
except ImportError:  # not built (make native), or no xxh3 library to bind
    _native = None

#: True when the extension is built and loaded.
AVAILABLE = _native is not None

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class Columns(NamedTuple):
    """The digest's columns for some files: 16 raw digest bytes a file."""

    sizes: list[int]
    mtimes: list[int]
    digests: bytes


def hash_names(directory: str, names: list[str], buffer_size: int, *, prefix: str = "") -> Columns:
    """Size, mtime and xxh3-128 of each file ``names`` in ``directory``, hashed without the GIL.

    ``prefix`` is the directory's path in the dataset, for messages.

    Raises what the pure loop raises: :class:`~dsagent.errors.SourceUnavailable` (or
    NotFound, ...) naming the file that could not be read, :class:`IntegrityError` for one
    whose size changed while it was read. Only call it when :data:`AVAILABLE`.
    """
    assert _native is not None, "the native extension is not built"
    with translate_errors(f"source directory {directory!r}"):
        dfd = os.open(directory, _O_DIR)
    try:
        sizes, mtimes, digests, failure = _native.hash_names(dfd, names, buffer_size)
    finally:
        os.close(dfd)
    if failure is not None:
        index, errno, expected, got = failure
        where = os.path.join(directory, names[index])
        if errno:
            with translate_errors(f"source file {where!r}"):
                raise OSError(errno, os.strerror(errno), where)
        raise IntegrityError(
            f"{prefix + names[index]!r} changed while it was digested ({expected} -> {got} bytes)",
            hint="retry once the source is quiet",
        )
    return Columns(sizes, mtimes, digests)


__all__ = ["AVAILABLE", "Columns", "hash_names"]
