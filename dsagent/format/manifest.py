"""Dataset manifests and digests: what a dataset *is*, independent of where it lives.

Who calls it: ``dsctl digest / pack / verify`` (through :mod:`dsagent.format.bundles.bundle`), and the
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
- **Reading costs the entries, not copies of them**: a stored
  manifest is parsed and checked a batch at a time (types, digests, path order) straight
  into an :class:`EntryTable` (the entries column-wise: ~104 bytes an entry instead of
  ~232 as FileEntry objects), the layout checks lean on the path order instead of sets of
  all paths, digests hash the canonical records a block at a time, and the stored form is
  written a block at a time. A 2.6 MB manifest of 10^6 entries (``d0000/f0000000``-style
  paths): peak RSS of a fresh reading process 169 MiB (~32 MiB of it imports; 267 MiB with
  FileEntry tuples); the agent that reads it, re-encodes it into
  its cache and fails on its missing bundles peaks at 224 MiB.

Stored format (``Manifest.to_bytes``): one line of plain JSON (the header: format,
version, name, file count, total bytes, dataset digest, bundle index, empty directories),
then one zstd frame (with its content checksum) holding one JSON array per file,
``[path, size, mtime_ns, digest]``, one per line, in path order. A reader can take the
digest from the first line without decompressing anything (:func:`read_manifest_header`).
"""

from __future__ import annotations

import io
import json
import operator
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, NamedTuple, cast

from dsagent.errors import IntegrityError, InvalidInput, NotFound
from dsagent.format import native
from dsagent.format.entries import (
    EntryTable,
    EntryTableBuilder,
    FileEntry,
    bundle_digest,
    check_layout,
    dataset_digest,
    digests_of,
    is_safe_path,
    path_key,
)
from dsagent.format.hashing import CHUNK_SIZE, FileHasher, hash_file, hash_stream
from dsagent.format.names import is_digest, validate_name
from dsagent.format.storageconfig import Options
from dsplatform.heap import collector_paused
from dsplatform.names import DIGEST_LENGTH

if TYPE_CHECKING:
    from dsagent.format.framereader import FrameReader

# Reading a stored manifest (zstd, fsspec) is imported where it happens: ``dsctl digest``
# only builds one, and its start-up is part of what users time.

FORMAT = "dsplatform-manifest"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest"
BUNDLES_DIR = "bundles"
BUNDLE_SUFFIX = ".tar.zst"

#: progress(bytes_done_increment, files_done_increment); a progress may also have
#: ``expect(total_bytes, total_files)``, which :func:`expect_total` calls once the work's
#: size is known (a display can then give a total, a percentage and an ETA)
Progress = Callable[[int, int], None]


def expect_total(progress: Progress | None, total_bytes: int, total_files: int) -> None:
    """Tell ``progress`` how much work there is, when it wants to know."""
    expect = getattr(progress, "expect", None)
    if callable(expect):
        expect(total_bytes, total_files)


_HEX_LINES = re.compile(r"(?:[0-9a-f]{32}\n)*")
#: Records hashed / paths checked per step: whole-manifest temporaries would cost ~100 bytes
#: an entry on top of the entries themselves.
_BLOCK = 4096
#: zstd level of a manifest's body: paths and hex digests came out smaller at level 1 than at
#: level 3 (200,000 entries: 5.9 MB against 6.7 MB), in half the time (0.029 s against 0.064 s).
MANIFEST_LEVEL = 1
#: zstd's workers for a manifest's body when a pack writes it to the store: they compress
#: while this thread formats the next lines (200,000 entries: 33 ms against 53 ms with none;
#: three or four did no better). The agent stores the manifests it fetched with none: the
#: workers' buffers raised its peak by 25-35 MiB for a million entries, and it is a
#: long-lived process held to a memory bound, where those 20 ms do not show.
MANIFEST_THREADS = 2


# --------------------------------------------------------------------------- values


class BundleRef(NamedTuple):
    """One tar+zstd bundle: a contiguous range of entries in path order."""

    digest: str  # names bundles/<digest>.tar.zst; see bundle_digest()
    first: int  # index of its first entry in Manifest.entries
    count: int  # type: ignore[assignment]  # number of entries (tuple's count() is not used on a ref)
    size: int  # uncompressed payload bytes (sum of the file sizes)
    compressed_size: int


class ManifestHeader(NamedTuple):
    """The first line of a stored manifest: enough for a consistency check."""

    name: str
    digest: str
    file_count: int
    total_bytes: int
    bundles: tuple[BundleRef, ...]
    directories: tuple[str, ...]


class Manifest(NamedTuple):
    """A dataset: its files in path order, its empty directories, its bundles, its digest.

    Build one with :meth:`create` (which computes the digest) or :func:`build_manifest`.
    """

    name: str
    entries: EntryTable  # sorted by path
    bundles: tuple[BundleRef, ...]  # empty when not packed
    digest: str  # dataset_digest(entries, directories)
    directories: tuple[str, ...] = ()  # empty directories, sorted

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
        try:
            if isinstance(entries, EntryTable):
                ordered = entries.in_path_order()
            else:
                ordered = EntryTable.of(sorted(entries, key=path_key))
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            raise InvalidInput(f"malformed file entry in dataset {name!r}: {exc}") from exc
        dirs = tuple(sorted(set(directories)))
        check_layout(ordered.paths, dirs)
        return cls._assemble(name, ordered, dirs, tuple(bundles))

    @classmethod
    def of_checked_layout(
        cls, name: str, entries: EntryTable, *, directories: Sequence[str], bundles: Sequence[BundleRef]
    ) -> Manifest:
        """:meth:`create` for ``entries`` in path order and sorted, unique ``directories``
        that the caller has just passed through :func:`check_layout` itself (the one-pass
        pack checks before it writes a bundle): the check is not run a second time."""
        check_dataset_name(name)
        if entries.in_path_order() is not entries or list(directories) != sorted(set(directories)):
            raise ValueError("entries must be in path order and directories sorted and unique")
        return cls._assemble(name, entries, tuple(directories), tuple(bundles))

    @classmethod
    def _assemble(
        cls, name: str, entries: EntryTable, dirs: tuple[str, ...], bundles: tuple[BundleRef, ...]
    ) -> Manifest:
        """Digest and bundle index of the (sorted, checked) entries, encoded a block at a time:
        each entry's records once, for the dataset digest and its bundle's."""
        _check_tiling(entries, bundles)
        try:
            digest, bundle_digests = digests_of(entries, dirs, [(b.first, b.count) for b in bundles])
        except (ValueError, TypeError, AttributeError, struct.error) as exc:
            raise InvalidInput(f"malformed file entry in dataset {name!r}: {exc}") from exc
        _check_bundles(entries, bundles, bundle_digests)
        return cls(name, entries, bundles, digest, dirs)

    @property
    def file_count(self) -> int:
        return len(self.entries)

    @property
    def total_bytes(self) -> int:
        return self.entries.total_bytes  # summed once, by the table: manifests can list millions

    @property
    def header(self) -> ManifestHeader:
        return ManifestHeader(self.name, self.digest, self.file_count, self.total_bytes, self.bundles, self.directories)

    def bundle_entries(self, bundle: BundleRef) -> EntryTable:
        """The entries stored in ``bundle``, in path order."""
        return self.entries[bundle.first : bundle.first + bundle.count]

    def with_bundles(self, bundles: Sequence[BundleRef]) -> Manifest:
        """This manifest with its bundle index set; checks the index tiles the entries."""
        refs = tuple(bundles)
        _check_tiling(self.entries, refs)
        _check_bundles(self.entries, refs, [bundle_digest(self.bundle_entries(ref)) for ref in refs])
        return self._replace(bundles=refs)

    def to_bytes(self, *, threads: int = 0) -> bytes:
        """The stored form: a JSON header line, then a zstd frame of JSON lines (compressed
        on ``threads`` zstd workers beside this thread; 0: on this thread alone)."""
        return encode_manifest(self, threads=threads)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and fully check a stored manifest; :class:`IntegrityError` if corrupt."""
        return decode_manifest(data)


# --------------------------------------------------------------------------- checks


def check_dataset_name(name: str) -> str:
    """``name`` if it is a valid dataset name (it becomes a directory in stores and caches)."""
    return validate_name(name)


def _check_tiling(entries: EntryTable, bundles: Sequence[BundleRef]) -> None:
    """:class:`IntegrityError` unless the bundle index tiles the entries in order."""
    position = 0
    for ref in bundles:
        if ref.first != position or ref.count <= 0 or not is_digest(ref.digest):
            raise IntegrityError(f"bundle index does not tile the entries at bundle {ref.digest!r}")
        if ref.first + ref.count > len(entries):
            raise IntegrityError(f"bundle {ref.digest} does not match the entries it claims")
        position = ref.first + ref.count
    if bundles and position != len(entries):
        raise IntegrityError(f"bundle index covers {position} of {len(entries)} entries")


def _check_bundles(entries: EntryTable, bundles: Sequence[BundleRef], digests: Sequence[str]) -> None:
    """:class:`IntegrityError` unless each bundle's digest (``digests``, computed from its
    entries) and payload size are those its entries give."""
    for ref, digest in zip(bundles, digests, strict=True):
        if digest != ref.digest:
            raise IntegrityError(f"bundle {ref.digest} does not match the entries it claims")
        if ref.size != sum(entries.sizes[ref.first : ref.first + ref.count]):
            raise IntegrityError(f"bundle {ref.digest} records the wrong payload size")


# --------------------------------------------------------------------------- stored form


def encode_manifest(manifest: Manifest, *, threads: int = 0) -> bytes:
    """:meth:`Manifest.to_bytes`: the same bytes decoded whatever ``threads`` is."""
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
    import zstandard  # here: building a manifest (dsctl digest) needs no zstd

    compressor = zstandard.ZstdCompressor(level=MANIFEST_LEVEL, write_checksum=True, threads=threads).compressobj()
    parts = [dumps(header).encode() + b"\n"]
    table = manifest.entries
    for start in range(0, len(table), _BLOCK):  # a block at a time: the body is never held uncompressed
        block = table[start : start + _BLOCK]
        lines = native.entry_lines(block) if native.AVAILABLE else None
        if lines is None:
            rows = zip(block.paths, block.sizes, block.mtimes, block.hex_digests(), strict=True)
            text = "\n".join(_entry_line(path, size, mtime, digest) for path, size, mtime, digest in rows) + "\n"
            lines = text.encode("utf-8", "surrogateescape")
        parts.append(compressor.compress(lines))
    parts.append(compressor.flush())
    return b"".join(parts)


_json_string = json.encoder.c_encode_basestring or json.encoder.py_encode_basestring  # type: ignore[attr-defined]


def _entry_line(path: str, size: int, mtime: int, digest: str) -> str:
    """One entry's line, byte for byte what ``json.dumps([path, size, mtime, digest],
    ensure_ascii=False, separators=(",", ":"))`` writes, at a third of its cost (only the
    path needs JSON's string escaping; the digest is hex)."""
    return f'[{_json_string(path)},{size},{mtime},"{digest}"]'


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


def _entry_batches(reader: FrameReader, limit: int, name: str) -> Iterator[list[bytes]]:
    """The entry lines of a manifest body, a decompressed chunk's worth at a time; each line
    at most :data:`MAX_ENTRY_LINE` bytes, at most ``limit`` of them (the count its header
    declares): a body cannot make the reader hold or parse more than its header promised
    (1 GiB of whitespace)."""
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


#: One parsed batch of entry lines, column-wise: paths, sizes, mtimes, hex digests.
_Columns = tuple[list[Any], list[Any], list[Any], list[Any]]


_LIST, _FOUR = {list}, {4}


def _parse_batch(lines: list[bytes]) -> _Columns:
    """One ``json.loads`` per batch (per line it is twice as slow); a line holding more or
    less than one array shows as a count that does not match. Bytes that are not UTF-8
    come back as the surrogates they were written from (a file name that is not UTF-8,
    as ``os.fsdecode`` gives it)."""
    rows = json.loads((b"[" + b",".join(lines) + b"]").decode("utf-8", "surrogateescape"))
    if len(rows) != len(lines):
        raise ValueError("an entry line does not hold exactly one entry")
    if set(map(type, rows)) - _LIST or set(map(len, rows)) - _FOUR:
        raise ValueError("an entry line is not [path, size, mtime_ns, digest]")
    paths, sizes, mtimes, digests = zip(*rows, strict=True)
    return list(paths), list(sizes), list(mtimes), list(digests)


_STR, _INT, _DIGEST_LENGTHS = {str}, {int}, {DIGEST_LENGTH}


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

    def batch(self, columns: _Columns) -> bool:
        """Check one batch; True when it is well formed (and so may join the table)."""
        paths, sizes, mtimes, digests = columns
        if self.malformed:
            return False
        if not paths:
            return True
        # the column's types as a set (``map`` in C: a generator a value cost 30 ms of a
        # 12,000-file unpack); ``type(v) is int`` refuses a bool, as the set does
        well_typed = (
            set(map(type, paths)) == _STR
            and set(map(type, sizes)) == _INT
            and min(sizes) >= 0
            and set(map(type, mtimes)) == _INT
            # exactly 32 characters each, else two digests joined by a newline pass the line check
            and set(map(type, digests)) == _STR
            and set(map(len, digests)) == _DIGEST_LENGTHS
        )
        if not well_typed or not _HEX_LINES.fullmatch("\n".join(digests) + "\n"):
            self.malformed = True
            return False
        return self.ordered(paths)

    def ordered(self, paths: list[str]) -> bool:
        """The path order of a well-formed batch (the native parse's: well typed by its
        form); True when it may join the table, as :meth:`batch`."""
        if self.malformed:
            return False
        if not paths:
            return True
        if (self._last is not None and not self._last < paths[0]) or not all(map(operator.lt, paths, paths[1:])):
            self.disordered = True
        self._last = paths[-1]
        return True


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


def read_manifest_stream(stream: IO[bytes], *, max_files: int | None = None) -> Manifest:
    """Parse and fully check a stored manifest read from ``stream``, as a stream: memory and
    work follow the entries its header declares, never what the body decompresses to.

    ``max_files``: refuse (:class:`InvalidInput`) a manifest whose header declares more
    files, before its body is read: the agent's bound on what one request can make it hold
    (~130 bytes an entry while it is read and checked)."""
    line, rest = _header_line(stream)
    header = _parse_header(line)
    if header.file_count < 0 or header.total_bytes < 0:
        raise IntegrityError(
            f"corrupt manifest {header.name!r}: negative counts in its header", hint="re-pack the dataset"
        )
    if max_files is not None and header.file_count > max_files:
        raise InvalidInput(
            f"dataset {header.name!r} lists {header.file_count} files; this agent accepts at most {max_files}",
            hint="raise DSAGENT_MAX_DATASET_FILES (and the agent's memory limit: ~130 bytes a file per fetch)",
        )
    table = EntryTableBuilder()
    first = rest or stream.read(1)
    if first:
        what = f"manifest {header.name!r}"
        from dsagent.format.framereader import FrameReader
        from dsagent.format.zstdframes import Prefixed

        reader = FrameReader(cast(IO[bytes], Prefixed(first, stream)), what, limit=header.file_count * MAX_ENTRY_LINE)
        checks = _BodyChecks()
        try:
            for batch in _entry_batches(reader, header.file_count, header.name):
                with collector_paused():  # thousands of rows, no reference cycle (dsplatform.heap)
                    plain = native.entry_columns(batch) if native.AVAILABLE else None
                    if plain is not None:  # in C: about a sixth of the json path's cost
                        if checks.ordered(plain[0]):
                            table.add_packed(*plain)
                        continue
                    columns = _parse_batch(batch)
                    if checks.batch(columns):
                        table.add(*columns)
        except (ValueError, TypeError, OverflowError) as exc:
            raise IntegrityError(f"corrupt manifest {header.name!r}: {exc}", hint="re-pack the dataset") from exc
        if checks.malformed:
            raise IntegrityError(f"corrupt manifest {header.name!r}: malformed file entry")
        if checks.disordered:
            raise IntegrityError(f"corrupt manifest {header.name!r}: entries are not in strict path order")
    return _checked(header, table.build())


def decode_manifest(data: bytes) -> Manifest:
    return read_manifest_stream(io.BytesIO(data))


def _checked(header: ManifestHeader, entries: EntryTable) -> Manifest:
    """The manifest of ``entries`` (well typed and in strict path order: :class:`_BodyChecks`)
    once its layout, dataset digest, counts and bundle index match ``header``."""
    try:
        check_dataset_name(header.name)
        check_layout(entries.paths, header.directories)
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


def read_manifest(store: str, name: str, *, storage_options: Options = None, max_files: int | None = None) -> Manifest:
    """The manifest of dataset ``name`` in bundle store ``store``; :class:`NotFound` if absent;
    ``max_files`` as in :func:`read_manifest_stream`."""
    from dsagent.format.oneversion import open_one_version
    from dsagent.format.storage import local_path, resolve, translate_errors

    local = local_path(store, storage_options)
    # a local store is read without fsspec (see local_path)
    fs, root = (None, local) if local is not None else resolve(store, storage_options)
    path = manifest_path(root, name)
    try:
        with translate_errors(f"manifest of {name!r} in {store}", fs=fs, path=path):
            stream: IO[bytes] = open(path, "rb") if fs is None else open_one_version(fs, path)  # noqa: SIM115 - closed below
            with stream:
                return read_manifest_stream(stream, max_files=max_files)
    except NotFound as exc:
        raise NotFound(
            f"no dataset {name!r} in bundle store {store}",
            hint=f"pack it first: dsctl pack SOURCE --name {name} --to {store}",
        ) from exc


def read_manifest_header(store: str, name: str, *, storage_options: Options = None) -> ManifestHeader:
    """Only the header line (digest, counts, bundle index): a cheap consistency check."""
    from dsagent.format.storage import resolve, translate_errors

    fs, root = resolve(store, storage_options)
    path = manifest_path(root, name)
    with translate_errors(f"manifest of {name!r} in {store}", fs=fs, path=path), fs.open(path, "rb") as stream:
        line, _ = _header_line(stream)
    return _parse_header(line)


__all__ = [
    "BUNDLES_DIR",
    "CHUNK_SIZE",
    "BundleRef",
    "EntryTable",
    "EntryTableBuilder",
    "FileEntry",
    "FileHasher",
    "Manifest",
    "ManifestHeader",
    "Progress",
    "expect_total",
    "bundle_digest",
    "bundle_path",
    "check_dataset_name",
    "dataset_digest",
    "digests_of",
    "hash_file",
    "hash_stream",
    "is_safe_path",
    "manifest_path",
    "read_manifest",
    "read_manifest_header",
]
