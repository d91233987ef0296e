"""Dataset manifests and digests: what a dataset *is*, independent of where it lives.

Who calls it: ``dsctl digest / pack / verify`` (through :mod:`dsagent.format.bundle`), and the
agent's consistency check and per-file copy path (``FileHasher``, :data:`CHUNK_SIZE`).

What it owns:

- the domain values :class:`FileEntry`, :class:`BundleRef` and :class:`Manifest`;
- the digests: a file's digest is xxh3-128 of its bytes; the dataset digest is xxh3-128
  over a canonical encoding of ``(path, size, file digest)`` in path order (plus the
  dataset's empty directories, see below), so equal content gives an equal digest on any
  machine whatever the walk order or the mtimes;
- values only: building a manifest from a source (walking and hashing) is
  :func:`dsagent.format.digester.build_manifest`, which imports this module and never the
  other way round; the streaming hasher lives in :mod:`dsagent.format.hashing` and is
  re-exported here;
- the stored manifest format and the bundle-store layout (``<store>/<name>/manifest``,
  ``<store>/bundles/<digest>.tar.zst``), and :func:`read_manifest`.

Decisions:

- **Empty directories** are part of a dataset (an empty class folder is still a class for
  an ``ImageFolder``-style loader): they are recorded in :attr:`Manifest.directories`,
  count in the dataset digest, and are recreated on unpack. Directories that contain
  files are implied by the file paths and not recorded.
- **An empty dataset** (a source directory that exists and holds no files) is valid: its
  manifest has no entries and no bundles, it unpacks to an empty directory. A source that
  does not exist raises :class:`NotFound` (on object stores an empty prefix does not
  exist, so a mistyped ``s3://`` prefix is an error, never an empty dataset).
- **Reading costs the entries, not copies of them** (issue 10 finding 5): a stored
  manifest is parsed and checked a batch at a time (types, digests, path order), the
  layout checks lean on the path order instead of sets of all paths, and digests hash
  the canonical records a block at a time. A 2.6 MB manifest of 10^6 entries
  (``d0000/f0000000``-style paths): peak RSS of a fresh reading process 465 -> 267 MiB,
  10.3 -> 4.3 s. Of that, ~221 MiB is the result itself (per entry: the FileEntry 64
  bytes, its path 64 and digest 96 in pymalloc blocks, 8 in the tuple) and ~32 MiB the
  imports (half of it fsspec); going lower means a leaner FileEntry (e.g. the digest held
  as 16 bytes), which is a change of the value type, not of the reader.

Stored format (``Manifest.to_bytes``): one line of plain JSON (the header: format,
version, name, file count, total bytes, dataset digest, bundle index, empty directories),
then one zstd frame (with its content checksum) holding one JSON array per file,
``[path, size, mtime_ns, digest]``, one per line, in path order. A reader can take the
digest from the first line without decompressing anything (:func:`read_manifest_header`).
"""

from __future__ import annotations

import io
import itertools
import json
import operator
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import IO, Any

import xxhash
import zstandard

from dsagent.errors import IntegrityError, InvalidInput, NotFound
from dsagent.format.hashing import CHUNK_SIZE, FileHasher, hash_file, hash_stream
from dsagent.format.names import is_digest, validate_name
from dsagent.format.storage import resolve, translate_errors
from dsagent.format.tarstream import FrameReader
from dsplatform.names import DIGEST_LENGTH

FORMAT = "dsplatform-manifest"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest"
BUNDLES_DIR = "bundles"
BUNDLE_SUFFIX = ".tar.zst"

#: progress(bytes_done_increment, files_done_increment)
Progress = Callable[[int, int], None]

_HEX_LINES = re.compile(r"(?:[0-9a-f]{32}\n)*")
_DATASET_DOMAIN = b"dsplatform/dataset/v1\n"
_BUNDLE_DOMAIN = b"dsplatform/bundle/v1\n"
_SIZE = struct.Struct("<Q")
_LEN = struct.Struct("<I")
#: Records hashed / paths checked per step: whole-manifest temporaries would cost ~100 bytes
#: an entry on top of the entries themselves (issue 10 finding 5).
_BLOCK = 4096


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a dataset."""

    path: str  # relative POSIX path, never absolute, never '..'
    size: int
    mtime_ns: int
    digest: str  # xxh3-128 of the content, 32 lowercase hex chars


@dataclass(frozen=True)
class BundleRef:
    """One tar+zstd bundle: a contiguous range of entries in path order."""

    digest: str  # names bundles/<digest>.tar.zst; see bundle_digest()
    first: int  # index of its first entry in Manifest.entries
    count: int  # number of entries
    size: int  # uncompressed payload bytes (sum of the file sizes)
    compressed_size: int


@dataclass(frozen=True)
class ManifestHeader:
    """The first line of a stored manifest: enough for a consistency check."""

    name: str
    digest: str
    file_count: int
    total_bytes: int
    bundles: tuple[BundleRef, ...]
    directories: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """A dataset: its files in path order, its empty directories, its bundles, its digest.

    Build one with :meth:`create` (which computes the digest) or :func:`build_manifest`.
    """

    name: str
    entries: tuple[FileEntry, ...]  # sorted by path
    bundles: tuple[BundleRef, ...]  # empty when not packed
    digest: str  # dataset_digest(entries, directories)
    directories: tuple[str, ...] = field(default=())  # empty directories, sorted

    @classmethod
    def create(
        cls,
        name: str,
        entries: Iterable[FileEntry],
        *,
        directories: Iterable[str] = (),
        bundles: Sequence[BundleRef] = (),
    ) -> Manifest:
        """A manifest with entries sorted, paths checked and the digest computed."""
        check_dataset_name(name)
        ordered = tuple(sorted(entries, key=_path_key))
        dirs = tuple(sorted(set(directories)))
        check_layout(ordered, dirs)
        return cls._assemble(name, ordered, dirs, tuple(bundles))

    @classmethod
    def _assemble(
        cls, name: str, entries: tuple[FileEntry, ...], dirs: tuple[str, ...], bundles: tuple[BundleRef, ...]
    ) -> Manifest:
        """Digest and bundle index of the (sorted, checked) entries, encoded a block at a time."""
        try:
            digest = _digest_of(_DATASET_DOMAIN, itertools.chain(_member_records(entries), _dir_records(dirs)))
        except (ValueError, TypeError, AttributeError, struct.error) as exc:
            raise InvalidInput(f"malformed file entry in dataset {name!r}: {exc}") from exc
        if bundles:
            _check_bundle_index(entries, bundles)
        return cls(name, entries, bundles, digest, dirs)

    @property
    def file_count(self) -> int:
        return len(self.entries)

    @cached_property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.entries)  # computed once: manifests can list millions

    @property
    def header(self) -> ManifestHeader:
        return ManifestHeader(self.name, self.digest, self.file_count, self.total_bytes, self.bundles, self.directories)

    def bundle_entries(self, bundle: BundleRef) -> Sequence[FileEntry]:
        """The entries stored in ``bundle``, in path order."""
        return self.entries[bundle.first : bundle.first + bundle.count]

    def with_bundles(self, bundles: Sequence[BundleRef]) -> Manifest:
        """This manifest with its bundle index set; checks the index tiles the entries."""
        refs = tuple(bundles)
        _check_bundle_index(self.entries, refs)
        return replace(self, bundles=refs)

    def to_bytes(self) -> bytes:
        """The stored form: a JSON header line, then a zstd frame of JSON lines."""
        return encode_manifest(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and fully check a stored manifest; :class:`IntegrityError` if corrupt."""
        return decode_manifest(data)


def _path_key(entry: FileEntry) -> str:
    return entry.path


_PATH = operator.attrgetter("path")  # _path_key at C speed, for the passes over every entry


# --------------------------------------------------------------------------- checks


def check_dataset_name(name: str) -> str:
    """``name`` if it is a valid dataset name (it becomes a directory in stores and caches)."""
    return validate_name(name)


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


def _first_unsafe_of(paths: Iterable[str]) -> str | None:
    """:func:`_first_unsafe` a block at a time: no joined copy of a whole manifest's paths."""
    remaining = iter(paths)
    while block := list(itertools.islice(remaining, _BLOCK)):
        bad = _first_unsafe(block)
        if bad is not None:
            return bad
    return None


def check_layout(entries: Sequence[FileEntry], directories: Sequence[str]) -> None:
    """Raise :class:`InvalidInput` unless paths are safe, unique, and no file is also a directory.

    ``entries`` are sorted by path (both callers sort or check the order first), so a
    duplicate is next to its twin and no set of all the paths is needed: memory follows
    the number of directories, not of files.
    """
    bad = _first_unsafe_of(map(_PATH, entries))
    if bad is not None:
        raise InvalidInput(f"unsafe path in dataset: {bad!r}", hint="paths must be relative, without '..'")
    if any(map(operator.eq, map(_PATH, entries), map(_PATH, itertools.islice(entries, 1, None)))):
        twin = next(a.path for a, b in zip(entries, itertools.islice(entries, 1, None)) if a.path == b.path)
        raise InvalidInput(f"duplicate path in dataset: {twin!r}")
    bad = _first_unsafe(list(directories))
    if bad is not None:
        raise InvalidInput(f"unsafe directory in dataset: {bad!r}")
    parents = {entry.path.rpartition("/")[0] for entry in entries}
    parents.update(path.rpartition("/")[0] for path in directories)
    expanded = set()
    for parent in parents:
        while parent and parent not in expanded:
            expanded.add(parent)
            parent = parent.rpartition("/")[0]
    dirs = expanded | set(directories)
    clash = next(filter(dirs.__contains__, map(_PATH, entries)), None)  # the first in path order
    if clash is not None:
        raise InvalidInput(f"path is both a file and a directory: {clash!r}")
    for directory in directories:
        if directory in expanded:
            raise InvalidInput(f"directory {directory!r} is not empty; only empty directories are listed")


def _check_bundle_index(entries: Sequence[FileEntry], bundles: Sequence[BundleRef]) -> None:
    position = 0
    for ref in bundles:
        if ref.first != position or ref.count <= 0 or not is_digest(ref.digest):
            raise IntegrityError(f"bundle index does not tile the entries at bundle {ref.digest!r}")
        end = ref.first + ref.count
        members = range(ref.first, end)  # indexes, not a slice: a bundle may hold most of the entries
        if end > len(entries) or bundle_digest(map(entries.__getitem__, members)) != ref.digest:
            raise IntegrityError(f"bundle {ref.digest} does not match the entries it claims")
        if ref.size != sum(entries[index].size for index in members):
            raise IntegrityError(f"bundle {ref.digest} records the wrong payload size")
        position = end
    if bundles and position != len(entries):
        raise IntegrityError(f"bundle index covers {position} of {len(entries)} entries")


# --------------------------------------------------------------------------- digests


def _member_records(entries: Iterable[FileEntry]) -> Iterator[bytes]:
    """The canonical record of each entry, in the order given, one at a time."""
    pack_size, pack_len, fromhex = _SIZE.pack, _LEN.pack, bytes.fromhex
    for entry in entries:
        name = entry.path.encode("utf-8", "surrogateescape")
        yield b"F" + pack_len(len(name)) + name + pack_size(entry.size) + fromhex(entry.digest)


def _dir_records(directories: Iterable[str]) -> list[bytes]:
    return [
        b"D" + _LEN.pack(len(raw)) + raw for raw in (d.encode("utf-8", "surrogateescape") for d in sorted(directories))
    ]


def _digest_of(domain: bytes, records: Iterable[bytes]) -> str:
    """xxh3-128 of ``domain`` then ``records``, hashed :data:`_BLOCK` records at a time."""
    state = xxhash.xxh3_128(domain)
    remaining = iter(records)
    while block := b"".join(itertools.islice(remaining, _BLOCK)):  # a record is never empty
        state.update(block)
    return state.hexdigest()


def dataset_digest(entries: Iterable[FileEntry], directories: Iterable[str] = ()) -> str:
    """xxh3-128 over the canonical encoding of ``(path, size, digest)`` in path order.

    Each file is ``b"F" + len(path) as u32 LE + UTF-8 path + size as u64 LE + 16 digest
    bytes``; each empty directory (after all files) is ``b"D" + len + path``. mtimes do
    not count, and the input order does not matter (entries are sorted here).
    """
    return _digest_of(
        _DATASET_DOMAIN, itertools.chain(_member_records(sorted(entries, key=_path_key)), _dir_records(directories))
    )


def bundle_digest(members: Iterable[FileEntry]) -> str:
    """xxh3-128 over the canonical encoding of a bundle's members (same records as files above).

    It depends only on what the bundle holds, so an unchanged run of files keeps its
    bundle (and its object ``bundles/<digest>.tar.zst``) across dataset versions.
    """
    return _digest_of(_BUNDLE_DOMAIN, _member_records(members))


# --------------------------------------------------------------------------- stored form


def encode_manifest(manifest: Manifest) -> bytes:
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "name": manifest.name,
        "files": manifest.file_count,
        "bytes": manifest.total_bytes,
        "digest": manifest.digest,
        "bundles": [[b.digest, b.first, b.count, b.size, b.compressed_size] for b in manifest.bundles],
        "directories": list(manifest.directories),
    }
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    body = "".join(dumps([e.path, e.size, e.mtime_ns, e.digest]) + "\n" for e in manifest.entries)
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    return dumps(header).encode() + b"\n" + compressor.compress(body.encode("utf-8", "surrogateescape"))


def _parse_header(line: bytes) -> ManifestHeader:
    try:
        raw = json.loads(line)
        if raw.get("format") != FORMAT:
            raise ValueError("not a dsplatform manifest")
        if raw.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"manifest format version {raw.get('version')!r} is not supported (this is {FORMAT_VERSION})"
            )
        bundles = tuple(BundleRef(str(d), int(f), int(c), int(s), int(z)) for d, f, c, s, z in raw["bundles"])
        return ManifestHeader(
            str(raw["name"]), str(raw["digest"]), int(raw["files"]), int(raw["bytes"]), bundles,
            tuple(str(d) for d in raw.get("directories", ())),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"corrupt manifest header: {exc}", hint="re-pack the dataset") from exc


#: The longest header line accepted (it holds the bundle index: ~100 bytes per bundle).
MAX_HEADER_LINE = 16 << 20
#: The longest entry line accepted: a JSON-escaped path of a few KB, numbers and a digest.
MAX_ENTRY_LINE = 64 << 10


class _Prefixed:
    """``stream`` with ``head`` put back in front of it (we peeked to see if a body exists)."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self._head, self._stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            return head
        return self._stream.read(size)


def _entry_batches(reader: FrameReader, limit: int, name: str) -> Iterator[list[bytes]]:
    """The entry lines of a manifest body, a decompressed chunk's worth at a time; each line
    at most :data:`MAX_ENTRY_LINE` bytes, at most ``limit`` of them (the count its header
    declares): a body cannot make the reader hold or parse more than its header promised
    (issue 10 finding 5: 1 GiB of whitespace)."""
    pending = b""
    count = 0
    while True:
        view = reader.read(CHUNK_SIZE)
        if not view:
            break
        pending += view
        *lines, pending = pending.split(b"\n")
        if len(pending) > MAX_ENTRY_LINE:
            raise IntegrityError(
                f"corrupt manifest {name!r}: an entry line is over {MAX_ENTRY_LINE} bytes", hint="re-pack the dataset"
            )
        count += len(lines)
        if count > limit:
            raise IntegrityError(
                f"corrupt manifest {name!r}: more entries than its header declares", hint="re-pack the dataset"
            )
        if lines:
            yield lines
    if pending:
        raise IntegrityError(f"corrupt manifest {name!r}: its last entry line is cut", hint="re-pack the dataset")


def _parse_batch(lines: list[bytes]) -> list[FileEntry]:
    """One ``json.loads`` per batch (per line it is twice as slow); a line holding more or
    less than one array shows as a count that does not match."""
    rows = json.loads(b"[" + b",".join(lines) + b"]")
    if len(rows) != len(lines):
        raise ValueError("an entry line does not hold exactly one entry")
    return [FileEntry(*row) for row in rows]


class _BodyChecks:
    """The per-entry checks of a manifest body, made a batch at a time as it is parsed.

    Faults are noted, not raised, so that a stored manifest is refused with the same error
    as when the checks ran over all the entries at once: a parse error anywhere first, then
    a malformed entry anywhere, then the path order.
    """

    def __init__(self) -> None:
        self.malformed = False
        self.disordered = False
        self._last: str | None = None  # the last path of the previous batch

    def batch(self, entries: list[FileEntry]) -> list[FileEntry]:
        if self.malformed or not entries:
            return entries
        well_typed = all(
            type(e.path) is str
            and type(e.size) is int
            and e.size >= 0
            and type(e.mtime_ns) is int
            and type(e.digest) is str
            and len(e.digest) == DIGEST_LENGTH  # else two digests joined by a newline pass the line check
            for e in entries
        )
        if not well_typed or not _HEX_LINES.fullmatch("\n".join(e.digest for e in entries) + "\n"):
            self.malformed = True
            return entries
        paths = [e.path for e in entries]
        if (self._last is not None and not self._last < paths[0]) or not all(map(operator.lt, paths, paths[1:])):
            self.disordered = True
        self._last = paths[-1]
        return entries


def _header_line(stream: IO[bytes]) -> tuple[bytes, bytes]:
    """The header line (at most :data:`MAX_HEADER_LINE` bytes) and what was read after it."""
    buffer = b""
    while b"\n" not in buffer:
        chunk = stream.read(1 << 16)
        if not chunk:
            raise IntegrityError("corrupt manifest: no header line", hint="re-pack the dataset")
        buffer += chunk
        if len(buffer) > MAX_HEADER_LINE and b"\n" not in buffer[: MAX_HEADER_LINE + 1]:
            raise IntegrityError("corrupt manifest: header line too long", hint="re-pack the dataset")
    line, _, rest = buffer.partition(b"\n")
    return line, rest


def read_manifest_stream(stream: IO[bytes]) -> Manifest:
    """Parse and fully check a stored manifest read from ``stream``, as a stream: memory and
    work follow the entries its header declares, never what the body decompresses to."""
    line, rest = _header_line(stream)
    header = _parse_header(line)
    if header.file_count < 0 or header.total_bytes < 0:
        raise IntegrityError(
            f"corrupt manifest {header.name!r}: negative counts in its header", hint="re-pack the dataset"
        )
    entries: tuple[FileEntry, ...] = ()
    first = rest or stream.read(1)
    if first:
        what = f"manifest {header.name!r}"
        reader = FrameReader(_Prefixed(first, stream), what, limit=header.file_count * MAX_ENTRY_LINE)  # type: ignore[arg-type]
        checks = _BodyChecks()
        try:
            entries = tuple(
                itertools.chain.from_iterable(
                    checks.batch(_parse_batch(batch))
                    for batch in _entry_batches(reader, header.file_count, header.name)
                )
            )
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"corrupt manifest {header.name!r}: {exc}", hint="re-pack the dataset") from exc
        if checks.malformed:
            raise IntegrityError(f"corrupt manifest {header.name!r}: malformed file entry")
        if checks.disordered:
            raise IntegrityError(f"corrupt manifest {header.name!r}: entries are not in strict path order")
    return _checked(header, entries)


def decode_manifest(data: bytes) -> Manifest:
    return read_manifest_stream(io.BytesIO(data))


def _checked(header: ManifestHeader, entries: tuple[FileEntry, ...]) -> Manifest:
    """The manifest of ``entries`` (well typed and in strict path order: :class:`_BodyChecks`)
    once its layout, dataset digest, counts and bundle index match ``header``."""
    try:
        check_dataset_name(header.name)
        check_layout(entries, header.directories)
        manifest = Manifest._assemble(header.name, entries, tuple(sorted(header.directories)), header.bundles)
    except InvalidInput as exc:
        raise IntegrityError(f"corrupt manifest {header.name!r}: {exc}") from exc
    if (
        manifest.digest != header.digest
        or manifest.file_count != header.file_count
        or manifest.total_bytes != header.total_bytes
    ):
        raise IntegrityError(f"corrupt manifest {header.name!r}: contents do not match its header digest")
    return manifest


# --------------------------------------------------------------------------- store layout


def manifest_path(store_root: str, name: str) -> str:
    return f"{store_root.rstrip('/')}/{check_dataset_name(name)}/{MANIFEST_FILE}"


def bundle_path(store_root: str, digest: str) -> str:
    if not is_digest(digest):
        raise InvalidInput(f"invalid bundle digest {digest!r}")
    return f"{store_root.rstrip('/')}/{BUNDLES_DIR}/{digest}{BUNDLE_SUFFIX}"


def read_manifest(store: str, name: str, *, storage_options: Mapping[str, Any] | None = None) -> Manifest:
    """The manifest of dataset ``name`` in bundle store ``store``; :class:`NotFound` if absent."""
    fs, root = resolve(store, storage_options)
    path = manifest_path(root, name)
    try:
        with translate_errors(f"manifest of {name!r} in {store}"), fs.open(path, "rb") as stream:
            return read_manifest_stream(stream)
    except NotFound as exc:
        raise NotFound(
            f"no dataset {name!r} in bundle store {store}",
            hint=f"pack it first: dsctl pack SOURCE --name {name} --to {store}",
        ) from exc


def read_manifest_header(store: str, name: str, *, storage_options: Mapping[str, Any] | None = None) -> ManifestHeader:
    """Only the header line (digest, counts, bundle index): a cheap consistency check."""
    fs, root = resolve(store, storage_options)
    path = manifest_path(root, name)
    with translate_errors(f"manifest of {name!r} in {store}"), fs.open(path, "rb") as stream:
        line, _ = _header_line(stream)
    return _parse_header(line)


__all__ = [
    "BUNDLES_DIR",
    "CHUNK_SIZE",
    "BundleRef",
    "FileEntry",
    "FileHasher",
    "Manifest",
    "ManifestHeader",
    "Progress",
    "bundle_digest",
    "bundle_path",
    "check_dataset_name",
    "dataset_digest",
    "hash_file",
    "hash_stream",
    "is_safe_path",
    "manifest_path",
    "read_manifest",
    "read_manifest_header",
]
