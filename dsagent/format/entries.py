"""A dataset's entries and what is computed from them alone: path checks and digests.

Who calls it: :mod:`dsagent.format.manifest` (which re-exports every public name here, so
callers import them from there), the digester and the bundle writer.

What it owns: the value :class:`FileEntry`, the column-wise :class:`EntryTable` a
manifest holds its entries in, the path-safety and layout checks (:func:`check_layout`),
and the canonical digests of a dataset and of a bundle (:func:`dataset_digest`,
:func:`bundle_digest`). The reasons for the column layout and the block-at-a-time passes
are in :mod:`dsagent.format.manifest`'s docstring.
"""

from __future__ import annotations

import functools
import itertools
import operator
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, overload

import xxhash

from dsagent.errors import InvalidInput
from dsagent.format import native
from dsplatform.names import DIGEST_LENGTH

_DATASET_DOMAIN = b"dsplatform/dataset/v1\n"
_BUNDLE_DOMAIN = b"dsplatform/bundle/v1\n"
_SIZE = struct.Struct("<Q")
_LEN = struct.Struct("<I")
#: Records hashed / paths checked per step: whole-manifest temporaries would cost ~100 bytes
#: an entry on top of the entries themselves.
_BLOCK = 4096

path_key = operator.attrgetter("path")  # the sort key of entries, at C speed


class FileEntry(NamedTuple):
    """One file of a dataset.

    A named tuple, not a frozen dataclass: packing and listing make one an entry, and a
    frozen dataclass's ``__init__`` (four ``object.__setattr__``) cost 1 us each, 0.2 s of a
    200,000-file pack; a tuple is built in C (``tuple.__new__``)."""

    path: str  # relative POSIX path, never absolute, never '..'
    size: int
    mtime_ns: int
    digest: str  # xxh3-128 of the content, 32 lowercase hex chars


#: a FileEntry from a tuple of its fields, in C (the named tuple's own ``__new__`` is Python)
_new_entry = functools.partial(tuple.__new__, FileEntry)


def new_entries(
    paths: Iterable[str], sizes: Iterable[int], mtimes: Iterable[int], digests: Iterable[str]
) -> Iterator[FileEntry]:
    """Entries from columns, built in C: a pack lists hundreds of thousands."""
    return map(_new_entry, zip(paths, sizes, mtimes, digests))


class EntryTable(Sequence[FileEntry]):
    """A manifest's entries held column-wise: what :attr:`Manifest.entries` is.

    A manifest can list millions of files, and a hostile one is read by the privileged
    agent. As objects an entry costs ~232 bytes (the FileEntry 64,
    its path 64, its hex digest 96, a tuple slot 8); here it costs its path (64 + a list
    slot 8), 16 raw digest bytes and two 8-byte numbers: ~104 bytes. :class:`FileEntry`
    stays the value callers see: indexing and iterating build them on demand, and the
    passes over every entry (path checks, digests, sizes) read the columns directly.

    Numbers are 64-bit: a size outside ``[0, 2**64)`` or an mtime outside int64 is not a
    file's, and raises :class:`OverflowError` when the table is built.
    """

    __slots__ = ("_total", "digests", "mtimes", "paths", "sizes")

    def __init__(self, paths: list[str], sizes: array[int], mtimes: array[int], digests: bytes) -> None:
        self.paths = paths
        self.sizes = sizes
        self.mtimes = mtimes
        self.digests = digests  # 16 raw bytes an entry
        self._total: int | None = None

    @classmethod
    def of(cls, entries: Iterable[FileEntry]) -> EntryTable:
        """The table of ``entries`` in the order given; :class:`ValueError` for a digest
        that is not hex, :class:`OverflowError` for numbers out of range."""
        if isinstance(entries, EntryTable):
            return entries
        builder = EntryTableBuilder()
        remaining = iter(entries)
        while block := list(itertools.islice(remaining, _BLOCK)):
            builder.add(
                [e.path for e in block], [e.size for e in block], [e.mtime_ns for e in block], [e.digest for e in block]
            )
        return builder.build()

    def __len__(self) -> int:
        return len(self.paths)

    @overload
    def __getitem__(self, index: int) -> FileEntry: ...
    @overload
    def __getitem__(self, index: slice) -> EntryTable: ...
    def __getitem__(self, index: int | slice) -> FileEntry | EntryTable:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self.paths))
            if step != 1:
                raise ValueError("an entry table slices with step 1 only")
            return EntryTable(
                self.paths[start:stop], self.sizes[start:stop], self.mtimes[start:stop],
                self.digests[16 * start : 16 * max(start, stop)],
            )  # fmt: skip
        i = range(len(self.paths))[index]  # IndexError, negative indexes
        return FileEntry(self.paths[i], self.sizes[i], self.mtimes[i], self.digests[16 * i : 16 * i + 16].hex())

    def in_path_order(self) -> EntryTable:
        """This table sorted by path: itself when it already is (a walk's usual order)."""
        paths = self.paths
        if all(map(operator.lt, paths, itertools.islice(paths, 1, None))):
            return self
        order = sorted(range(len(paths)), key=paths.__getitem__)
        digests = self.digests
        return EntryTable(
            [paths[i] for i in order],
            array("Q", [self.sizes[i] for i in order]),
            array("q", [self.mtimes[i] for i in order]),
            b"".join([digests[16 * i : 16 * i + 16] for i in order]),
        )

    def __iter__(self) -> Iterator[FileEntry]:
        return new_entries(self.paths, self.sizes, self.mtimes, self.hex_digests())

    def hex_digests(self) -> Iterator[str]:
        """The file digests as :class:`FileEntry` holds them (32 lowercase hex characters)."""
        digests, step = self.digests, 16 * _BLOCK
        for start in range(0, len(digests), step):  # .hex() of a block, then slices: 4x faster than per digest
            hexed = digests[start : start + step].hex()
            yield from (hexed[o : o + 32] for o in range(0, len(hexed), 32))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EntryTable):
            return (
                self.digests == other.digests and self.paths == other.paths
                and self.sizes == other.sizes and self.mtimes == other.mtimes
            )  # fmt: skip
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(map(operator.eq, self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((len(self.paths), self.digests))

    def __repr__(self) -> str:
        return f"<EntryTable of {len(self.paths)} entries>"

    @property
    def total_bytes(self) -> int:
        """The sizes' sum, summed once (a table's columns are not changed after it is built)."""
        if self._total is None:
            self._total = sum(self.sizes)
        return self._total

    def record_blocks(self, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
        """The canonical digest records of entries ``start`` to ``stop`` (see
        :func:`dataset_digest`), in order, :data:`_BLOCK` records joined per item: encoded
        in C when the native extension is built (a tenth of the cost), else column-wise in
        Python. They are the serial tail of every digest and of every manifest check."""
        stop = len(self.paths) if stop is None else stop
        for first in range(start, stop, _BLOCK):
            end = min(first + _BLOCK, stop)
            paths, sizes, digests = self.paths[first:end], self.sizes[first:end], self.digests[16 * first : 16 * end]
            block = native.digest_records(paths, sizes, digests) if native.AVAILABLE else None
            yield _records(paths, sizes, digests) if block is None else block


def _records(paths: Sequence[str], sizes: Sequence[int], digests: bytes) -> bytes:
    """The digest records of some entries, joined (the pure rule; built column-wise with
    slice assignment: twice as fast as one concatenation per record)."""
    names = [path.encode("utf-8", "surrogateescape") for path in paths]
    count = len(names)
    parts: list[bytes] = [b"F"] * (5 * count)
    parts[1::5] = map(_LEN.pack, map(len, names))
    parts[2::5] = names
    parts[3::5] = map(_SIZE.pack, sizes)
    parts[4::5] = [digests[offset : offset + 16] for offset in range(0, 16 * count, 16)]
    return b"".join(parts)


class EntryTableBuilder:
    """An :class:`EntryTable` grown a batch of columns at a time (the manifest reader, the
    digest's process pool); the digests join into one ``bytes`` at the end."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.sizes = array("Q")
        self.mtimes = array("q")
        self._digests = bytearray()

    def add(self, paths: list[str], sizes: list[int], mtimes: list[int], hex_digests: list[str]) -> None:
        if len(hex_digests) != len(paths):
            raise ValueError(f"{len(hex_digests)} digests for {len(paths)} files")
        raw = bytes.fromhex("".join(hex_digests))
        if len(raw) != 16 * len(hex_digests) or set(map(len, hex_digests)) - {DIGEST_LENGTH}:
            raise ValueError("a file digest is not 32 hex characters")
        self.sizes.extend(sizes)
        self.mtimes.extend(mtimes)
        self._digests += raw
        self.paths.extend(paths)

    def add_raw(self, paths: list[str], sizes: list[int], mtimes: list[int], digests: bytes) -> None:
        """:meth:`add` with the digests as 16 raw bytes each (the native digest's form)."""
        if len(digests) != 16 * len(paths):
            raise ValueError("not 16 digest bytes per file")
        self.sizes.extend(sizes)
        self.mtimes.extend(mtimes)
        self._digests += digests
        self.paths.extend(paths)

    def add_packed(self, paths: list[str], sizes: bytes, mtimes: bytes, digests: bytes) -> None:
        """:meth:`add_raw` with the sizes and mtimes as native int64s, 8 bytes a file (the
        native tree digest's form)."""
        if not len(sizes) == len(mtimes) == 8 * len(paths) or len(digests) != 16 * len(paths):
            raise ValueError("not 8 size, 8 mtime and 16 digest bytes per file")
        self.sizes.frombytes(sizes)
        self.mtimes.frombytes(mtimes)
        self._digests += digests
        self.paths.extend(paths)

    def build(self) -> EntryTable:
        return EntryTable(self.paths, self.sizes, self.mtimes, bytes(self._digests))


# --------------------------------------------------------------------------- path checks


def is_safe_path(path: str) -> bool:
    """True when ``path`` is a clean relative POSIX path that stays below its root."""
    return _first_unsafe([path]) is None


def _first_unsafe(paths: Sequence[str]) -> str | None:
    """The first unsafe path: empty, absolute, with an empty, '.' or '..' component, or a NUL.

    All paths are checked at once on their NUL-joined form with a few substring searches
    (C speed; a regex over every character cost more than hashing a manifest's records),
    and scanned one by one only when one fails.
    """
    if not paths:
        return None
    joined = "\x00" + "\x00".join(paths) + "\x00"  # every path between NULs
    if (
        joined.count("\x00") == len(paths) + 1  # no path holds a NUL
        and "\x00\x00" not in joined  # empty path
        and "\x00/" not in joined  # absolute
        and "//" not in joined  # empty component
        and "/\x00" not in joined  # trailing slash
        and "\x00.\x00" not in (components := joined.replace("/", "\x00"))  # '.' component
        and "\x00..\x00" not in components  # '..' component
    ):
        return None
    return next(
        p
        for p in paths
        if not p or "\x00" in p or p.startswith("/") or any(part in ("", ".", "..") for part in p.split("/"))
    )


def _first_unsafe_of(paths: Sequence[str]) -> str | None:
    """:func:`_first_unsafe` of every path: in one C pass when the native extension is built
    (native/layout.c, the same rule: an eighth of the cost), else a block at a time, with no
    joined copy of a whole manifest's paths."""
    if native.AVAILABLE:
        at = native.first_unsafe(paths)
        return paths[at] if at >= 0 else None
    remaining = iter(paths)
    while block := list(itertools.islice(remaining, _BLOCK)):
        bad = _first_unsafe(block)
        if bad is not None:
            return bad
    return None


def parent_dirs(paths: Sequence[str]) -> set[str]:
    """The directory each of ``paths`` is in ("" at the top): not their ancestors."""
    return native.parents(paths) if native.AVAILABLE else {path.rpartition("/")[0] for path in paths}


def check_layout(paths: Sequence[str], directories: Sequence[str]) -> None:
    """Raise :class:`InvalidInput` unless paths are safe, unique, and no file is also a directory.

    ``paths`` (the files') are sorted (both callers sort or check the order first), so a
    duplicate is next to its twin and no set of all the paths is needed: memory follows
    the number of directories, not of files.
    """
    bad = _first_unsafe_of(paths)
    if bad is not None:
        raise InvalidInput(f"unsafe path in dataset: {bad!r}", hint="paths must be relative, without '..'")
    if any(map(operator.eq, paths, itertools.islice(paths, 1, None))):
        twin = next(a for a, b in zip(paths, itertools.islice(paths, 1, None)) if a == b)
        raise InvalidInput(f"duplicate path in dataset: {twin!r}")
    bad = _first_unsafe(list(directories))
    if bad is not None:
        raise InvalidInput(f"unsafe directory in dataset: {bad!r}")
    parents = parent_dirs(paths)
    parents.update(path.rpartition("/")[0] for path in directories)
    expanded = set()
    for parent in parents:
        while parent and parent not in expanded:
            expanded.add(parent)
            parent = parent.rpartition("/")[0]
    dirs = expanded | set(directories)
    clash = next(filter(dirs.__contains__, paths), None)  # the first in path order
    if clash is not None:
        raise InvalidInput(f"path is both a file and a directory: {clash!r}")
    for directory in directories:
        if directory in expanded:
            raise InvalidInput(f"directory {directory!r} is not empty; only empty directories are listed")


# --------------------------------------------------------------------------- digests


def _dir_records(directories: Iterable[str]) -> list[bytes]:
    """The canonical records of empty directories (sorted), as one block."""
    return [
        b"".join(
            b"D" + _LEN.pack(len(raw)) + raw
            for raw in (d.encode("utf-8", "surrogateescape") for d in sorted(directories))
        )
    ]


def _digest_of(domain: bytes, blocks: Iterable[bytes]) -> str:
    """xxh3-128 of ``domain`` then the record ``blocks``, one block at a time."""
    state = xxhash.xxh3_128(domain)
    for block in blocks:
        state.update(block)
    return state.hexdigest()


def dataset_digest(entries: Iterable[FileEntry], directories: Iterable[str] = ()) -> str:
    """xxh3-128 over the canonical encoding of ``(path, size, digest)`` in path order.

    Each file is ``b"F" + len(path) as u32 LE + UTF-8 path + size as u64 LE + 16 digest
    bytes``; each empty directory (after all files) is ``b"D" + len + path``. mtimes do
    not count, and the input order does not matter (entries are sorted here).
    """
    return table_digest(EntryTable.of(sorted(entries, key=path_key)), directories)


def table_digest(table: EntryTable, directories: Iterable[str]) -> str:
    """The dataset digest of ``table`` (in path order) and its empty ``directories``."""
    return _digest_of(_DATASET_DOMAIN, itertools.chain(table.record_blocks(), _dir_records(directories)))


def digests_of(
    table: EntryTable, directories: Iterable[str], spans: Iterable[tuple[int, int]]
) -> tuple[str, list[str]]:
    """The dataset digest of ``table`` (in path order) and its empty ``directories``, and the
    bundle digest of each ``(first, count)`` span of it, with each entry's records encoded
    once for both. The spans follow each other from the first entry (a bundle index that
    tiles the table, checked by the caller); entries after the last span count only in the
    dataset digest."""
    whole = xxhash.xxh3_128(_DATASET_DOMAIN)
    parts: list[str] = []
    position = 0
    for first, count in spans:
        if first != position or count < 0 or first + count > len(table):
            raise ValueError("the spans do not tile the entries in order")
        part = xxhash.xxh3_128(_BUNDLE_DOMAIN)
        for block in table.record_blocks(first, first + count):
            whole.update(block)
            part.update(block)
        parts.append(part.hexdigest())
        position = first + count
    for block in itertools.chain(table.record_blocks(position), _dir_records(directories)):
        whole.update(block)
    return whole.hexdigest(), parts


def bundle_digest(members: Iterable[FileEntry]) -> str:
    """xxh3-128 over the canonical encoding of a bundle's members (same records as files above).

    It depends only on what the bundle holds, so an unchanged run of files keeps its
    bundle (and its object ``bundles/<digest>.tar.zst``) across dataset versions.
    """
    return _digest_of(_BUNDLE_DOMAIN, EntryTable.of(members).record_blocks())
