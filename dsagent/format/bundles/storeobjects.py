"""Objects written into a bundle store atomically: a bundle, a manifest, a scratch file.

Who calls it: :mod:`dsagent.format.bundles.bundle` (``write_bundles`` and the one-pass pack, the
manifest) and the pack pipeline (:mod:`dsagent.format.bundles.packwriter` and
:mod:`dsagent.format.bundles.packparallel`, which write through :class:`CountingWriter`). What it
owns: how one object reaches the store whole or not at all (:func:`store_object`: a
temporary file written out as it grows, fsync, rename and an fsync of the directory on
local disks; one PUT, published on its completed close, on object stores), the bundle named only once written
(:func:`store_new_bundle`), a full disk said as :class:`~dsagent.errors.InsufficientSpace`,
and the vectored write of a pipeline's pieces into a local file (:meth:`CountingWriter.writev`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from dsagent.errors import InsufficientSpace, is_full_disk
from dsagent.format.durable import Writeback, fsync_dir, writeback_for
from dsagent.format.manifest import BUNDLES_DIR, EntryTable, EntryTableBuilder, FileEntry, bundle_digest, bundle_path
from dsagent.format.storage import translate_errors
from dsagent.format.walk import is_local

if TYPE_CHECKING:
    from fsspec.spec import AbstractFileSystem

#: pieces one ``writev`` takes (POSIX guarantees at least 16; Linux takes 1,024)
_IOV_MAX = 1024


class CountingWriter:
    """Counts the compressed bytes zstd writes into the store object; with a ``writeback``,
    reports them to it, which starts the disk's writeback while the pack goes on."""

    def __init__(self, raw: IO[bytes], writeback: Writeback | None = None) -> None:
        self.raw = raw
        self.written = 0
        self._writeback = writeback

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.written += len(data)
        if self._writeback is not None:
            self._writeback.written(self.raw.fileno(), len(data))
        return len(data)

    def writev(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Write ``pieces`` in order: one ``writev`` into a local file, else joined first."""
        size = sum(len(piece) for piece in pieces)
        try:
            fd = self.raw.fileno()
        except (AttributeError, OSError, ValueError):  # an object store's file, or a Python buffer
            self.raw.write(b"".join(pieces))
        else:
            self.raw.flush()  # anything buffered goes first (writes through write() are)
            _writev_all(fd, pieces, size)
            if self._writeback is not None:
                self._writeback.written(fd, size)
        self.written += size

    def flush(self) -> None:
        self.raw.flush()


def _writev_all(fd: int, pieces: Sequence[bytes | memoryview], size: int) -> None:
    """``os.writev`` until every byte of ``pieces`` is written (a short write goes on)."""
    views = [memoryview(piece) for piece in pieces]
    while size:
        done = os.writev(fd, views[:_IOV_MAX])
        size -= done
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def _write_synced(tmp: str, fill: Any, what: str) -> int:
    """Write the new local file ``tmp`` with ``fill(stream)`` and fsync it; removed again on failure.

    Its filesystem's :class:`~dsagent.format.durable.Writeback` starts writing it out every
    32 MiB, so the disk works while the pack does and the fsync waits only for the tail
    (a 735 MB bundle on this project's disk: the pack took 0.74 s in process, the fsync
    at the end most of the 0.32 s over tmpfs); a failed background flush fails the write."""
    writeback = writeback_for(os.path.dirname(tmp) or ".")
    since = writeback.mark()
    try:
        with open(tmp, "xb") as raw:
            counter = CountingWriter(raw, writeback)
            fill(counter)
            raw.flush()
            os.fsync(raw.fileno())
        writeback.check(since)
    except BaseException as exc:
        _remove_temporary(tmp)
        if is_full_disk(exc):
            raise InsufficientSpace(
                f"no space left in the bundle store for {what}: {exc}", hint="free space in the store"
            ) from exc
        raise
    return counter.written


def _remove_temporary(tmp: str) -> None:
    with translate_errors(f"temporary {tmp!r}"):
        if os.path.exists(tmp):
            os.unlink(tmp)


def store_object(fs: AbstractFileSystem, path: str, fill: Any) -> int:
    """Write one object atomically with ``fill(stream)``; the number of bytes written."""
    if is_local(fs):
        directory, _, base = path.rpartition("/")
        tmp = f"{directory}/.{base}.{os.urandom(16).hex()}.tmp"
        written = _write_synced(tmp, fill, base)
        try:
            os.replace(tmp, path)
        except BaseException:
            _remove_temporary(tmp)
            raise
        fsync_dir(directory)
        return written
    with fs.open(path, "wb") as raw:  # object stores publish an object only on a completed close
        counter = CountingWriter(raw)
        fill(counter)
    return counter.written


def store_new_bundle(
    fs: AbstractFileSystem, root: str, members: Sequence[FileEntry], fill: Any
) -> tuple[str, int, bytes, bool]:
    """Write a bundle whose name is known only once it is written (the one-pass pack).

    ``fill`` writes into a temporary object in ``bundles/`` and returns the members'
    digests (16 raw bytes each); the object is then renamed to
    ``bundles/<bundle digest>.tar.zst``, or dropped when the store already holds that
    bundle (same members, same bytes: the one there is kept, as :func:`write_bundles`
    keeps it). Local stores: fsync, rename, fsync of the
    directory, as :func:`store_object`; object stores: one PUT of the temporary object and
    a server-side move. Returns ``(bundle digest, stored size, member digests, whether it
    was new to the store)``.
    """
    directory = f"{root.rstrip('/')}/{BUNDLES_DIR}"
    tmp = f"{directory}/.pack-{os.urandom(16).hex()}.tmp"
    read: list[bytes] = []  # the members' digests, once fill has returned them

    def record(raw: CountingWriter) -> None:
        read.append(fill(raw))

    if is_local(fs):
        size = _write_synced(tmp, record, "a new bundle")
        try:
            digest = bundle_digest(named(members, read[0]))
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
        return digest, size, read[0], new
    try:
        size = store_object(fs, tmp, record)
        digest = bundle_digest(named(members, read[0]))
        path = bundle_path(root, digest)
        new = stored_size(fs, path) is None
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
    return digest, size, read[0], new


def named(members: Sequence[FileEntry], digests: Sequence[str] | bytes) -> EntryTable:
    """``members`` with their digests: hex, or 16 raw bytes each as read while packing them
    (a table: built column-wise, with no object a file, for a bundle's digest)."""
    table = EntryTableBuilder()  # it refuses any count of digests but one a member
    columns = [e.path for e in members], [e.size for e in members], [e.mtime_ns for e in members]
    if isinstance(digests, bytes):
        table.add_raw(*columns, digests)
    else:
        table.add(*columns, list(digests))
    return table.build()


def stored_size(fs: AbstractFileSystem, path: str) -> int | None:
    """The size of a stored object, or None when it is absent (one round trip)."""
    try:
        return int(fs.size(path))
    except FileNotFoundError:
        return None


__all__ = ["CountingWriter", "named", "store_new_bundle", "store_object", "stored_size"]
