"""The optional native loops: ``dsagent.format._native``, a C extension built by the package's build.

Who calls it: the digest (:func:`dsagent.format.digester.digest_files`), which hashes a
local tree with :func:`hash_tree` (a thread a core inside one call) when the extension is
here, and with its pure-Python loops on forked processes otherwise (same manifest either way; the tests hold
the two paths equal); verified extraction (:mod:`dsagent.format.bundles.extract`), whose
member loop :func:`extract_members` runs in C when the extension is here; and the pack's
reader (:class:`dsagent.format.bundles.packwriter.BundleWriter`), which lays out a local bundle's
tar stream with :func:`tar_reader` (the same bytes and digests as its Python loop); and the
one-pass pack's serial steps around it: the listing (:func:`list_dirs`, a batch of
directories a call), the bundle plan's boundaries (:func:`plan_cuts`), the manifest's lines
(:func:`entry_lines`) and the digest records of the entries (:func:`digest_records`, for
every dataset and bundle digest), each the Python rule's result exactly. What it owns:
whether the extension is loaded (:data:`LOADED`) and whether its loops run
(:data:`AVAILABLE`: loaded and not switched off by the process's edge, :func:`use_native`;
:func:`describe` says which and why), the call that turns the walk's groups of names
into the digest's columns, and the hand-over between the C member loop
and the Python one.

The C member loop takes only members it can check completely: a header exactly as bundles
write it (:data:`~dsagent.format.tarstream.USTAR`, checksum right) naming the *next*
entry of the bundle, with its size. Anything else (a pax or GNU header, a link, a device,
another name, a bad checksum) is handed back, header and all, to the Python parser, whose
rules decide it as they do without the extension (so every refusal is the pure path's own,
with its message); a member out of order sends the rest of the bundle to the Python loop.

Why C at all, and why optional: the pure-Python digest spends ~15 us of interpreter work per
file under the GIL, so it needs one process per core, pickled replies and a serial merge; the
C loop opens, stats, reads and hashes the files with the GIL released, on threads of its
own that use every core (figures and the decision: docs/design-native.md). ``pip install``
builds it where a C compiler is (``setup.py``: an optional extension), so a machine without
one installs and runs the pure path.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from dsagent.errors import IntegrityError
from dsagent.format.hashing import CHUNK_SIZE, HASH_BUFFER, changed_error
from dsagent.format.storage import translate_errors
from dsplatform import cores

if TYPE_CHECKING:
    from dsagent.format.framereader import FrameReader

#: The extension's interface this module speaks (``INTERFACE`` in native/dsnative.c): one
#: built from other sources (an install upgraded over an earlier ``make native``) is not used.
INTERFACE = 22

#: why the extension is not loaded, when it is not
NOT_BUILT = "not built: install with a C compiler, or make native in a checkout"
_load_problem: str | None = None
try:
    from dsagent.format import _native  # type: ignore[attr-defined]
except ImportError as exc:  # not built (no compiler at install time), or unloadable
    _native = None
    _load_problem = NOT_BUILT if exc.name == "dsagent.format._native" else f"cannot load: {exc}"
if _native is not None and getattr(_native, "INTERFACE", None) != INTERFACE:
    import logging  # here: only this warning logs

    logging.getLogger(__name__).warning(
        "the native extension %s was built from other sources: the pure-Python loops run (make native)",
        _native.__file__,
    )
    _native = None
    _load_problem = "built from other sources (make native)"


class Table(Protocol):
    """What the loops read of an entry table (:class:`dsagent.format.entries.EntryTable`,
    which imports this module to encode its digest records, so it is not imported here)."""

    paths: list[str]
    sizes: array[int]
    mtimes: array[int]
    digests: bytes


class Member(Protocol):
    """What the pack's reader reads of an entry (:class:`dsagent.format.entries.FileEntry`)."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def digest(self) -> str: ...


_M = TypeVar("_M", bound=Member)

#: True when the extension is built and loaded, whether or not it is switched on.
LOADED = _native is not None

#: True when the native loops run: loaded, and not switched off by :func:`use_native`.
#: Every caller reads it at call time (``native.AVAILABLE``), never copies it.
AVAILABLE = LOADED

#: Why the native loops do not run (None while they do): the extension's load problem, or
#: what :func:`use_native` was told.
OFF_REASON: str | None = _load_problem


def use_native(enabled: bool, *, why_off: str = "switched off") -> bool:
    """Switch the native loops on (when :data:`LOADED`) or off for this process and the
    processes it forks; returns :data:`AVAILABLE`.

    Called once by each process's edge with its setting (``DSAGENT_NATIVE``: the node
    agent from its settings, ``dsctl``, ``dsagent`` and the demo from their command line's
    edge); this module reads no environment. ``why_off`` is what :func:`describe` says
    when ``enabled`` is false."""
    global AVAILABLE, OFF_REASON
    AVAILABLE = LOADED and enabled
    OFF_REASON = None if AVAILABLE else (_load_problem if enabled else why_off)
    return AVAILABLE


def off_reason() -> str | None:
    """Why the native loops do not run (not built, or ``DSAGENT_NATIVE``); None when they do."""
    return None if AVAILABLE else (OFF_REASON or "switched off")


def describe() -> str:
    """``on``, or ``off (why)``: what the start-up line and ``--version`` say."""
    off = off_reason()
    return "on" if off is None else f"off ({off})"


class SystemCalls(NamedTuple):
    """Two system calls the extension makes without ctypes."""

    mallopt: Callable[[int, int], bool]  # (option, value) -> glibc's verdict
    syncfs: Callable[[int], int]  # fd -> 0 or the errno


def system_calls() -> SystemCalls | None:
    """The extension's ``mallopt`` and ``syncfs`` (:func:`dsplatform.heap.keep_stream_chunks`,
    :func:`dsagent.format.durable.syncfs`), or None where it is not loaded (then ctypes
    makes them). Not loops: the switch leaves them."""
    return None if _native is None else SystemCalls(_native.mallopt, _native.syncfs)


def spare_cores(jobs_at_once: int) -> int:
    """The threads each of ``jobs_at_once`` bundles packed together reads its files on (the
    pack reader's ``threads``): the cores shared out, at least one."""
    return max(1, cores.usable() // max(1, jobs_at_once))


def chosen(native: bool | None) -> bool:
    """Whether a caller's ``native`` choice runs the native loops: ``None`` when they are
    on (:data:`AVAILABLE`), ``False`` never, ``True`` always (:class:`RuntimeError` saying
    why when they are off)."""
    if native and not AVAILABLE:
        raise RuntimeError(f"the native loops are off: {OFF_REASON or NOT_BUILT}")
    return AVAILABLE if native is None else native


class Group(Protocol):
    """What :func:`hash_tree` reads of a walk's group (:class:`dsagent.format.walk.Dir`, a
    tuple ``(rel, path, names)``; the walk imports this module, so it is not imported here)."""

    @property
    def rel(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def names(self) -> list[str]: ...


#: Whether each of :func:`hash_tree`'s threads takes a table of file descriptors of its own:
#: the threads of one process open and close through one shared table otherwise, and
#: contend for its lock on many cores (native/pool.c).
ISOLATE_FDS = True


def hash_tree(groups: Sequence[Group], *, threads: int, cap: int = HASH_BUFFER) -> tuple[bytes, bytes, bytes]:
    """Size, mtime and xxh3-128 of every file of the walk's ``groups``, in their order, on
    up to ``threads`` threads started and joined inside one call without the GIL
    (native/hashtree.c): native int64 sizes and mtimes (8 bytes a file) and raw digests (16).

    Raises what the pure loop raises for the first file in order that failed:
    :class:`~dsagent.errors.SourceUnavailable` (or NotFound, ...) naming the file or
    directory that could not be read, :class:`IntegrityError` for a file whose size
    changed while it was read. Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    sizes, mtimes, digests, failure = _native.hash_tree(groups, cap, threads, ISOLATE_FDS)
    if failure is None:
        return sizes, mtimes, digests
    index, errno, expected, got = failure
    for group in groups:
        if index < len(group.names):
            break
        index -= len(group.names)
    if expected < 0:  # the directory did not open
        with translate_errors(f"source directory {group.path!r}"):
            raise OSError(errno, os.strerror(errno), group.path)
    where = os.path.join(group.path, group.names[index])
    if errno:
        with translate_errors(f"source file {where!r}"):
            raise OSError(errno, os.strerror(errno), where)
    raise changed_error(f"{group.rel}/{group.names[index]}" if group.rel else group.names[index], expected, got)


#: What :func:`list_dirs` hands back a directory.
Listed = tuple[list[str], bytes, list[str], list[str], int, int, int]


def list_dirs(directories: list[str], prefixes: list[str], *, stat: bool = True, threads: int = 1) -> list[Listed]:
    """Directories of the pack's listing, read and their regular files stat'ed without the
    GIL (native/listdir.c, all of them in one release), as columns a directory: the
    regular files' paths (its prefix + name, in byte order of the names); their size,
    mtime ns, inode and ctime ns, four native int64 a file (``array("q", stats)``); the
    names of the entries that are directories by ``d_type``; the names of every other
    entry (symlinks, anything else, for the caller's rules); the count of entries; the
    directory's own device and inode. ``stat=False``: a file ``d_type`` calls regular is
    taken as one without a stat, its numbers 0 (the digest's walk). ``threads`` > 1: read on
    that many threads started and joined inside the call (none outlives it, so the process
    may still fork). Opening or reading one fails as :class:`OSError` with the path of the
    first in order that failed."""
    assert _native is not None, "the native extension is not built"
    return _native.list_dirs(directories, prefixes, stat, threads)  # type: ignore[no-any-return]


def block_samples(view: memoryview, block: int, pieces: int, piece: int) -> bytes:
    """The sample of each ``block`` of ``view``, one after the other: byte for byte what
    :mod:`dsagent.format.bundles.frames` cuts in Python, for a whole buffer in one call
    (native/probe.c). Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    return _native.block_samples(view, block, pieces, piece)  # type: ignore[no-any-return]


def zero_tails(view: memoryview, block: int, least: int) -> array[int]:
    """The bytes of :func:`dsagent.format.bundles.frames.zero_runs` in each ``block`` of ``view``,
    counted in C (native/probe.c). Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    return array("q", _native.zero_tails(view, block, least))


def rle_frame(view: memoryview, least: int) -> bytes:
    """:func:`dsagent.format.bundles.frames.rle_frame`, built in C (native/probe.c).

    Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    return _native.rle_frame(view, least)  # type: ignore[no-any-return]


def entry_lines(table: Table) -> bytes | None:
    """The manifest's lines of ``table``'s entries, encoded, formatted in C (native/manifestlines.c):
    byte for byte what :func:`dsagent.format.manifest.encode_manifest`'s Python loop writes,
    at a tenth of its cost. None when a path holds surrogates (that loop encodes them)."""
    assert _native is not None, "the native extension is not built"
    lines: bytes | None = _native.entry_lines(table.paths, table.sizes, table.mtimes, table.digests)
    return lines


def entry_columns(lines: list[bytes]) -> tuple[list[str], bytes, bytes, bytes] | None:
    """A batch of a manifest's entry lines parsed in C (native/manifestlines.c): the paths,
    and the sizes, mtimes and digests as packed bytes (8, 8 and 16 an entry), the values
    :func:`dsagent.format.manifest.read_manifest_stream`'s json path reads. None when any
    line is not in the plain form the writer gives a path needing no escape (that path
    parses the batch, and says what is wrong with it)."""
    assert _native is not None, "the native extension is not built"
    columns: tuple[list[str], bytes, bytes, bytes] | None = _native.entry_columns(lines)
    return columns


def digest_records(paths: list[str], sizes: array[int], digests: bytes) -> bytes | None:
    """The entries' digest records (:meth:`dsagent.format.entries.EntryTable.record_blocks`),
    encoded in C (native/manifestlines.c), byte for byte what the Python loop joins. None
    when a path holds surrogates (that loop encodes them)."""
    assert _native is not None, "the native extension is not built"
    records: bytes | None = _native.digest_records(paths, sizes, digests)
    return records


def sized_files(root: str, paths: list[str], sizes: array[int], start: int, stop: int) -> list[int]:
    """The indexes in ``[start, stop)`` whose ``root/paths[i]`` is not a regular file of
    ``sizes[i]`` bytes (missing, another kind, another size, an lstat that fails), found
    with one lstat a file and the GIL released for the whole loop (native/sizecheck.c).
    Opening ``root`` fails as :class:`OSError`. Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    return _native.sized_files(root, paths, sizes, start, stop)  # type: ignore[no-any-return]


def first_unsafe(paths: Sequence[str]) -> int:
    """The index of the first path that :func:`dsagent.format.entries.is_safe_path` refuses,
    or -1; checked in C (native/layout.c). Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    return _native.first_unsafe(paths)  # type: ignore[no-any-return]


def parents(paths: Sequence[str]) -> set[str]:
    """``{p.rpartition("/")[0] for p in paths}``, built in C (native/layout.c): a string only
    where a path's parent differs from its neighbour's. Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    return _native.parents(paths)  # type: ignore[no-any-return]


def plan_cuts(paths: list[str], upto: list[int], max_files: int, max_bytes: int) -> list[int] | None:
    """The gaps where :func:`dsagent.format.bundles.bundle.plan_bundles` cuts, computed in C
    (native/plan.c: the same priorities, domains and caps). None when a path holds
    surrogates (the Python loop hashes the bytes they stand for)."""
    assert _native is not None, "the native extension is not built"
    cuts: list[int] | None = _native.plan_cuts(paths, upto, max_files, max_bytes)
    return cuts


# what Unpacker.feed reports (native/unpackloop.c)
_MORE, _FOREIGN, _END, _SIZE, _DIGEST, _ERRNO = range(6)
_IN_DATA = 2
_FAILED_CREATE = 1  # Unpacker.failed_op: the file's create; else a write, its mtime or its close


def extract_members(
    reader: FrameReader,
    dir_fd: int,
    members: Table,
    what: str,
    *,
    seen: set[str],
    one_member: Callable[[], int | None],
    rest: Callable[[], None],
    written: Callable[[int], None],
    progress: Callable[[int, int], None] | None,
    path: Callable[[int], str],
    by_name: bool = False,
    writers: int = 1,
) -> None:
    """A bundle's members from ``reader`` into ``dir_fd`` (each entry under its index, or with
    ``by_name`` at its path, its directories made beforehand), by the C loop; ``writers`` > 1:
    the members whole in a chunk are written on that many threads (native/unpackloop.c).

    ``one_member`` is the Python loop's step: it parses, checks and writes the next member
    (or raises its error) and returns its index, or None at the end of the archive; ``rest``
    is the Python loop for whatever follows; ``path(index)`` is where the Python loop creates
    entry ``index`` (what its error names). Each path written is added to ``seen``;
    ``written`` is told the bytes written, ``progress`` the bytes and files. Stops after the
    end-of-archive block (the caller drains the stream); raises what the pure loop raises:
    a file that cannot be created is an :class:`OSError` naming ``path(index)``, as
    ``os.open`` raises it; a failed write, mtime or close one naming no file, as ``os.write``
    and ``os.utime`` of a descriptor raise it (so ENOSPC, EDQUOT, EFBIG and EEXIST read alike
    on both paths).
    """
    assert _native is not None, "the native extension is not built"
    from dsagent.format.tarstream import plain_template  # here: the digest, which imports this module, needs no tar

    paths = members.paths
    loop = _native.Unpacker(
        dir_fd, [p.encode("utf-8", "surrogateescape") for p in paths], members.sizes, members.mtimes,
        members.digests, plain_template(), by_name=by_name, writers=writers,
    )  # fmt: skip
    try:
        while True:
            view = reader.read(CHUNK_SIZE)
            if not view:
                if loop.phase == _IN_DATA:
                    raise IntegrityError(f"{what} is truncated inside a member", hint="re-fetch or re-pack it")
                raise IntegrityError(f"{what} ends in the middle of a tar record", hint="re-fetch or re-pack it")
            first, before = loop.next, loop.written
            used, status, a, b = loop.feed(view)
            if loop.next != first:
                seen.update(paths[first : loop.next])
                written(loop.written - before)
                if progress is not None:
                    progress(loop.written - before, loop.next - first)
            if status == _MORE:
                continue
            if status == _END:
                reader.unread(view[used:])
                return
            if status == _FOREIGN:
                reader.unread(a + bytes(view[used:]))
                index = one_member()
                if index is None:
                    return
                if index != loop.next:  # out of order: the Python loop's rules for the rest
                    rest()
                    return
                loop.skip_to(index + 1)
                continue
            if status == _SIZE:
                raise IntegrityError(f"{what}: {paths[a]!r} has {b} bytes, the manifest says {members.sizes[a]}")
            if status == _DIGEST:
                raise IntegrityError(
                    f"{what}: {paths[a]!r} does not match its digest",
                    hint="the bundle is corrupt or was tampered with; re-pack the dataset",
                )
            if loop.failed_op == _FAILED_CREATE:
                raise OSError(b, os.strerror(b), path(a))
            raise OSError(b, os.strerror(b))
    finally:
        loop.close()  # its writing threads end here, an error included: none outlives the call


def set_io_hook(hook: Callable[[str, int, bytes | None], object] | None) -> None:
    """Fault injection's view of the C unpack loop's writes (``tools/support/faults.py``):
    ``hook(kind, fd, name)`` is called before each file's create (``"open"``, the directory's
    descriptor and the name) and each write (``"write"``, the file's descriptor, None); an
    :class:`OSError` it raises is that call's failure. None removes it. Only call it when
    :data:`LOADED`."""
    assert _native is not None, "the native extension is not built"
    _native.set_io_hook(hook)


# what TarReader.fill reports (native/packloop.c)
FILL_MORE, FILL_DONE, FILL_ERRNO, FILL_CHANGED, FILL_DIGEST = range(5)


def tar_reader(dir_fd: int, members: Sequence[_M], header: Callable[[_M], bytes], *, threads: int = 1) -> Any:
    """The C reader of one bundle's tar stream (``native/packloop.c``): ``members`` (entries:
    path, size, mtime_ns, digest) opened relative to ``dir_fd``; ``header(member)``: the
    header bytes of a member whose header is not a plain ustar block (Python's tarfile
    writes those), asked once each. Its ``fill(buffer)`` writes the stream on into
    ``buffer`` and says how far it got; ``digests`` holds the 16-byte digests of the
    members finished. ``threads`` > 1: the members whole in a buffer are read on that many
    threads, kept until its ``close()``. Only call it when :data:`AVAILABLE`."""
    assert _native is not None, "the native extension is not built"
    from dsagent.format.tarstream import plain_template

    return _native.TarReader(dir_fd, members, plain_template(), header, threads=threads)


__all__ = [
    "AVAILABLE",
    "LOADED",
    "NOT_BUILT",
    "OFF_REASON",
    "off_reason",
    "FILL_CHANGED",
    "FILL_DIGEST",
    "FILL_DONE",
    "FILL_ERRNO",
    "FILL_MORE",
    "chosen",
    "describe",
    "spare_cores",
    "SystemCalls",
    "system_calls",
    "use_native",
    "block_samples",
    "rle_frame",
    "zero_tails",
    "extract_members",
    "hash_tree",
    "entry_lines",
    "list_dirs",
    "plan_cuts",
    "first_unsafe",
    "parents",
    "tar_reader",
    "set_io_hook",
]
