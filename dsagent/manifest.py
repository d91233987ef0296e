"""Dataset manifests and digests: what a dataset *is*, independent of where it lives.

Who calls it: ``dsctl digest / pack / verify`` (through :mod:`dsagent.bundle`), and the
agent's consistency check and per-file copy path (``FileHasher``, :data:`CHUNK_SIZE`).

What it owns:

- the domain values :class:`FileEntry`, :class:`BundleRef` and :class:`Manifest`;
- the digests: a file's digest is xxh3-128 of its bytes; the dataset digest is xxh3-128
  over a canonical encoding of ``(path, size, file digest)`` in path order (plus the
  dataset's empty directories, see below), so equal content gives an equal digest on any
  machine whatever the walk order or the mtimes;
- walking any fsspec URL or local path into a manifest (:func:`build_manifest`), hashing
  in a thread pool (xxhash and file reads release the GIL) with an optional
  :class:`~dsagent.digestcache.DigestCache`;
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

Stored format (``Manifest.to_bytes``): one line of plain JSON (the header: format,
version, name, file count, total bytes, dataset digest, bundle index, empty directories),
then one zstd frame (with its content checksum) holding one JSON array per file,
``[path, size, mtime_ns, digest]``, one per line, in path order. A reader can take the
digest from the first line without decompressing anything (:func:`read_manifest_header`).
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import IO, TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

import xxhash
import zstandard
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from dsagent.errors import IntegrityError, InvalidInput, NotFound
from dsagent.storage import resolve, translate_errors

if TYPE_CHECKING:
    from dsagent.digestcache import DigestCache

#: Bytes read per call when hashing or copying a file; large enough that per-call
#: overhead vanishes, small enough to stay in L2 and never hold a whole file in memory.
CHUNK_SIZE = 1 << 20

#: Digest threads for remote sources, where each file costs a round trip.
REMOTE_WORKERS = 16
FORMAT = "dsplatform-manifest"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest"
BUNDLES_DIR = "bundles"
BUNDLE_SUFFIX = ".tar.zst"

#: progress(bytes_done_increment, files_done_increment)
Progress = Callable[[int, int], None]

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_DATASET_DOMAIN = b"dsplatform/dataset/v1\n"
_BUNDLE_DOMAIN = b"dsplatform/bundle/v1\n"
_SIZE = struct.Struct("<Q")
_LEN = struct.Struct("<I")


# --------------------------------------------------------------------------- hashing


class FileHasher:
    """Streaming xxh3-128 of one file's bytes: ``update`` chunks, then ``hexdigest``.

    The agent's per-file copy path feeds it the chunks it copies, so a file is hashed
    while it is written and never read twice.
    """

    __slots__ = ("_state", "size")

    def __init__(self) -> None:
        self._state = xxhash.xxh3_128()
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._state.update(data)
        self.size += len(data)

    def hexdigest(self) -> str:
        return self._state.hexdigest()


def hash_stream(stream: IO[bytes], chunk_size: int = CHUNK_SIZE) -> tuple[str, int]:
    """``(digest, size)`` of everything left in ``stream``, read ``chunk_size`` at a time."""
    hasher = FileHasher()
    while chunk := stream.read(chunk_size):
        hasher.update(chunk)
    return hasher.hexdigest(), hasher.size


def hash_file(path: str | os.PathLike[str], buffer: bytearray | None = None) -> tuple[str, int]:
    """``(digest, size)`` of a local file, read with one reusable buffer (no per-chunk allocation)."""
    buf = buffer if buffer is not None else bytearray(CHUNK_SIZE)
    view = memoryview(buf)
    state = xxhash.xxh3_128()
    size = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        while n := os.readv(fd, [buf]):
            state.update(view[:n])
            size += n
    finally:
        os.close(fd)
    return state.hexdigest(), size


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
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
        manifest = cls(name, ordered, (), dataset_digest(ordered, dirs), dirs)
        return manifest.with_bundles(bundles) if bundles else manifest

    @property
    def file_count(self) -> int:
        return len(self.entries)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.entries)

    @property
    def header(self) -> ManifestHeader:
        return ManifestHeader(
            self.name, self.digest, self.file_count, self.total_bytes, self.bundles, self.directories
        )

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


# --------------------------------------------------------------------------- checks


def check_dataset_name(name: str) -> str:
    """``name`` if it is a valid dataset name (it becomes a directory in stores and caches)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(
            f"invalid dataset name {name!r}",
            hint="use 1-253 characters from A-Z a-z 0-9 . _ - starting with a letter or digit",
        )
    return name


def is_safe_path(path: str) -> bool:
    """True when ``path`` is a clean relative POSIX path that stays below its root."""
    if not path or path.startswith("/") or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def check_layout(entries: Sequence[FileEntry], directories: Sequence[str]) -> None:
    """Raise :class:`InvalidInput` unless paths are safe, unique, and no file is also a directory."""
    files: set[str] = set()
    for entry in entries:
        if not is_safe_path(entry.path):
            raise InvalidInput(f"unsafe path in dataset: {entry.path!r}", hint="paths must be relative, without '..'")
        if entry.path in files:
            raise InvalidInput(f"duplicate path in dataset: {entry.path!r}")
        files.add(entry.path)
    parents = {path.rsplit("/", 1)[0] for path in files if "/" in path}
    parents.update(path.rsplit("/", 1)[0] for path in directories if "/" in path)
    expanded = set()
    for parent in parents:
        while parent and parent not in expanded:
            expanded.add(parent)
            parent = parent.rpartition("/")[0]
    clash = files & (expanded | set(directories))
    if clash:
        raise InvalidInput(f"path is both a file and a directory: {sorted(clash)[0]!r}")
    for directory in directories:
        if not is_safe_path(directory):
            raise InvalidInput(f"unsafe directory in dataset: {directory!r}")
        if directory in expanded:
            raise InvalidInput(f"directory {directory!r} is not empty; only empty directories are listed")


def _check_bundle_index(entries: Sequence[FileEntry], bundles: Sequence[BundleRef]) -> None:
    position = 0
    for ref in bundles:
        if ref.first != position or ref.count <= 0 or not _HEX32.match(ref.digest):
            raise IntegrityError(f"bundle index does not tile the entries at bundle {ref.digest!r}")
        members = entries[ref.first : ref.first + ref.count]
        if len(members) != ref.count or bundle_digest(members) != ref.digest:
            raise IntegrityError(f"bundle {ref.digest} does not match the entries it claims")
        if ref.size != sum(member.size for member in members):
            raise IntegrityError(f"bundle {ref.digest} records the wrong payload size")
        position += ref.count
    if bundles and position != len(entries):
        raise IntegrityError(f"bundle index covers {position} of {len(entries)} entries")


# --------------------------------------------------------------------------- digests


def _encode_members(entries: Iterable[FileEntry]) -> Iterator[bytes]:
    pack_size, pack_len = _SIZE.pack, _LEN.pack
    for entry in entries:
        name = entry.path.encode("utf-8", "surrogateescape")
        yield b"F" + pack_len(len(name)) + name + pack_size(entry.size) + bytes.fromhex(entry.digest)


def _digest_of(domain: bytes, records: Iterable[bytes]) -> str:
    state = xxhash.xxh3_128(domain)
    batch: list[bytes] = []
    for record in records:
        batch.append(record)
        if len(batch) >= 4096:
            state.update(b"".join(batch))
            batch.clear()
    state.update(b"".join(batch))
    return state.hexdigest()


def dataset_digest(entries: Iterable[FileEntry], directories: Iterable[str] = ()) -> str:
    """xxh3-128 over the canonical encoding of ``(path, size, digest)`` in path order.

    Each file is ``b"F" + len(path) as u32 LE + UTF-8 path + size as u64 LE + 16 digest
    bytes``; each empty directory (after all files) is ``b"D" + len + path``. mtimes do
    not count, and the input order does not matter (entries are sorted here).
    """
    ordered = sorted(entries, key=_path_key)
    dir_records = (b"D" + _LEN.pack(len(raw)) + raw for raw in (d.encode("utf-8", "surrogateescape") for d in sorted(directories)))
    return _digest_of(_DATASET_DOMAIN, _chain(_encode_members(ordered), dir_records))


def bundle_digest(members: Iterable[FileEntry]) -> str:
    """xxh3-128 over the canonical encoding of a bundle's members (same records as files above).

    It depends only on what the bundle holds, so an unchanged run of files keeps its
    bundle (and its object ``bundles/<digest>.tar.zst``) across dataset versions.
    """
    return _digest_of(_BUNDLE_DOMAIN, _encode_members(members))


def _chain(*parts: Iterable[bytes]) -> Iterator[bytes]:
    for part in parts:
        yield from part


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
            raise ValueError(f"manifest format version {raw.get('version')!r} is not supported (this is {FORMAT_VERSION})")
        bundles = tuple(BundleRef(str(d), int(f), int(c), int(s), int(z)) for d, f, c, s, z in raw["bundles"])
        return ManifestHeader(
            str(raw["name"]), str(raw["digest"]), int(raw["files"]), int(raw["bytes"]), bundles,
            tuple(str(d) for d in raw.get("directories", ())),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"corrupt manifest header: {exc}", hint="re-pack the dataset") from exc


def decode_manifest(data: bytes) -> Manifest:
    line, newline, body = data.partition(b"\n")
    if not newline:
        raise IntegrityError("corrupt manifest: no header line", hint="re-pack the dataset")
    header = _parse_header(line)
    try:
        text = zstandard.ZstdDecompressor().decompress(body) if body else b""
        rows = json.loads(b"[" + text.rstrip(b"\n").replace(b"\n", b",") + b"]") if text else []
        entries = tuple(FileEntry(str(p), int(s), int(m), str(d)) for p, s, m, d in rows)
    except (zstandard.ZstdError, ValueError, TypeError) as exc:
        raise IntegrityError(f"corrupt manifest {header.name!r}: {exc}", hint="re-pack the dataset") from exc
    if any(not _HEX32.match(e.digest) or e.size < 0 for e in entries):
        raise IntegrityError(f"corrupt manifest {header.name!r}: malformed file entry")
    if [e.path for e in entries] != sorted(e.path for e in entries):
        raise IntegrityError(f"corrupt manifest {header.name!r}: entries are not in path order")
    try:
        check_layout(entries, header.directories)
        check_dataset_name(header.name)
    except InvalidInput as exc:
        raise IntegrityError(f"corrupt manifest {header.name!r}: {exc}") from exc
    manifest = Manifest(header.name, entries, (), dataset_digest(entries, header.directories), header.directories)
    if manifest.digest != header.digest or manifest.file_count != header.file_count or manifest.total_bytes != header.total_bytes:
        raise IntegrityError(f"corrupt manifest {header.name!r}: contents do not match its header digest")
    return manifest.with_bundles(header.bundles)


# --------------------------------------------------------------------------- store layout


def manifest_path(store_root: str, name: str) -> str:
    return f"{store_root.rstrip('/')}/{check_dataset_name(name)}/{MANIFEST_FILE}"


def bundle_path(store_root: str, digest: str) -> str:
    if not _HEX32.match(digest):
        raise InvalidInput(f"invalid bundle digest {digest!r}")
    return f"{store_root.rstrip('/')}/{BUNDLES_DIR}/{digest}{BUNDLE_SUFFIX}"


def read_manifest(store: str, name: str, *, storage_options: Mapping[str, Any] | None = None) -> Manifest:
    """The manifest of dataset ``name`` in bundle store ``store``; :class:`NotFound` if absent."""
    fs, root = resolve(store, storage_options)
    path = manifest_path(root, name)
    try:
        with translate_errors(f"manifest of {name!r} in {store}"):
            data = fs.cat_file(path)
    except NotFound as exc:
        raise NotFound(f"no dataset {name!r} in bundle store {store}", hint=f"pack it first: dsctl pack SOURCE --name {name} --to {store}") from exc
    return Manifest.from_bytes(data)


def read_manifest_header(store: str, name: str, *, storage_options: Mapping[str, Any] | None = None) -> ManifestHeader:
    """Only the header line (digest, counts, bundle index): a cheap consistency check."""
    fs, root = resolve(store, storage_options)
    path = manifest_path(root, name)
    with translate_errors(f"manifest of {name!r} in {store}"), fs.open(path, "rb") as stream:
        line = stream.readline()
    return _parse_header(line.rstrip(b"\n"))


# --------------------------------------------------------------------------- walking


class _Found(NamedTuple):
    """A file found by the walk, before hashing (a tuple: the walk makes millions)."""

    path: str  # relative to the source root
    location: str  # where to read it (absolute local path or fsspec path)
    size: int
    mtime_ns: int
    inode: int = 0
    ctime_ns: int = 0


def is_local(fs: AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


#: inode of a local file the walk listed but did not stat yet
_UNSTATED = -1


def _iter_local(root: str, empty: list[str]) -> Iterator[_Found]:
    """Files under a local ``root`` as the walk finds them (empty directories go to ``empty``).

    Follows symlinks (a linked file is packed as a regular file) and refuses loops.
    """
    seen: set[tuple[int, int]] = set()
    stack = [("", root)]
    while stack:
        rel, directory = stack.pop()
        st = os.stat(directory)
        if (st.st_dev, st.st_ino) in seen:
            raise InvalidInput(f"directory loop through symlinks at {directory!r}", hint="remove the looping link")
        seen.add((st.st_dev, st.st_ino))
        has_child = False
        with os.scandir(directory) as it:
            for item in it:
                has_child = True
                child = f"{rel}/{item.name}" if rel else item.name
                # d_type answers without a syscall (except through symlinks); the stat that
                # sizes and dates a file happens on the digest threads, in parallel
                if item.is_dir():
                    stack.append((child, item.path))
                elif item.is_file():
                    yield _Found(child, item.path, -1, 0, _UNSTATED, 0)
                elif item.is_symlink() and not os.path.exists(item.path):
                    raise InvalidInput(f"broken symlink in source: {item.path!r}", hint="fix or remove the link")
                else:
                    raise InvalidInput(f"not a regular file: {item.path!r}", hint="datasets hold regular files only")
        if not has_child and rel:
            empty.append(rel)


def _walk_local(root: str) -> tuple[list[_Found], list[str]]:
    empty: list[str] = []
    return list(_iter_local(root, empty)), empty


def _mtime_ns(info: Mapping[str, Any]) -> int:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created", "modified"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1_000_000_000)
        try:
            return int(float(value) * 1_000_000_000)
        except (TypeError, ValueError):
            continue
    return 0


def _walk_remote(fs: AbstractFileSystem, root: str) -> tuple[list[_Found], list[str]]:
    listing = fs.find(root, withdirs=True, detail=True)
    prefix = root.rstrip("/") + "/"
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    quoted = any(p in ("http", "https") for p in protocols)  # URLs name files percent-encoded
    found: list[_Found] = []
    dirs: list[str] = []
    for full, info in listing.items():
        full = full.rstrip("/")
        if not full.startswith(prefix):
            continue
        rel = unquote(full[len(prefix) :]) if quoted else full[len(prefix) :]
        if info.get("type") == "directory":
            dirs.append(rel)
        else:
            size = info.get("size")  # http listings give none: -1, taken from the read
            found.append(_Found(rel, full, int(size) if size is not None else -1, _mtime_ns(info)))
    parents = {f.path.rsplit("/", 1)[0] for f in found if "/" in f.path}
    parents |= {d.rsplit("/", 1)[0] for d in dirs if "/" in d}
    return found, [d for d in dirs if d not in parents]


def walk_source(fs: AbstractFileSystem, root: str, empty: list[str]) -> Iterable[_Found]:
    """Every file of the dataset at ``root`` (empty directories go to ``empty``); a lone file is a dataset of one.

    Local trees are walked lazily, so hashing starts while the walk goes on.
    """
    with translate_errors(f"source {root!r}"):
        if not fs.exists(root):
            raise NotFound(f"dataset source {root!r} does not exist", hint="check the path or URL")
        if not fs.isdir(root):
            info = fs.info(root)
            name = root.rstrip("/").rsplit("/", 1)[-1]
            if is_local(fs):
                st = os.stat(root)
                return [_Found(name, root, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)]
            size = info.get("size")
            return [_Found(name, root, int(size) if size is not None else -1, _mtime_ns(info))]
        if is_local(fs):
            return _iter_local(root, empty)
        found, dirs = _walk_remote(fs, root)
        empty.extend(dirs)
        return found


# --------------------------------------------------------------------------- digesting


def default_workers() -> int:
    """Hashing threads: one per core (reads and xxh3 release the GIL), capped."""
    return min(8, os.cpu_count() or 1)


class _Hasher:
    """Stats, looks up and hashes batches of found files; called from the digest threads.

    Each result is ``(entry, found)`` where ``found`` is the stat'ed file when it was
    hashed (to be recorded in the digest cache) and ``None`` when the cache answered.
    """

    def __init__(self, fs: AbstractFileSystem, progress: Progress | None, cache: DigestCache | None, snapshot: dict[str, Any]) -> None:
        self._fs = fs
        self._local = is_local(fs)
        self._progress = progress
        self._cache = cache
        self._snapshot = snapshot
        self._lock = threading.Lock()

    def batch(self, items: Sequence[_Found]) -> list[tuple[FileEntry, _Found | None]]:
        buffer = bytearray(CHUNK_SIZE) if self._local else None
        results: list[tuple[FileEntry, _Found | None]] = []
        item = None
        try:
            for item in items:
                results.append(self._one(item, buffer))
        except OSError as exc:  # translated here, once per batch rather than per file
            where = item.location if item is not None else "?"
            with translate_errors(f"source file {where!r}"):
                raise exc
        if self._progress is not None:
            with self._lock:
                self._progress(sum(entry.size for entry, _ in results), len(results))
        return results

    def _one(self, item: _Found, buffer: bytearray | None) -> tuple[FileEntry, _Found | None]:
        if buffer is None:
            with self._fs.open(item.location, "rb") as stream:
                digest, size = hash_stream(stream)
        else:
            if item.inode == _UNSTATED:
                st = os.stat(item.location)
                item = _Found(item.path, item.location, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
            if self._cache is not None:
                known = self._cache.match(self._snapshot, item)
                if known is not None:
                    return FileEntry(item.path, item.size, item.mtime_ns, known), None
            digest, size = hash_file(item.location, buffer)
        if size != item.size and item.size >= 0:
            raise IntegrityError(f"{item.path!r} changed while it was digested ({item.size} -> {size} bytes)", hint="retry once the source is quiet")
        return FileEntry(item.path, size, item.mtime_ns, digest), item


class _Batches:
    """Hashes files in batches of 32 on a thread pool, or inline with one worker."""

    SIZE = 32

    def __init__(self, hasher: _Hasher, workers: int) -> None:
        self._hasher = hasher
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dsagent-digest") if workers > 1 else None
        self._batch: list[_Found] = []
        self._futures: list[Future[list[tuple[FileEntry, _Found | None]]]] = []
        self._inline: list[tuple[FileEntry, _Found | None]] = []

    def add(self, item: _Found) -> None:
        self._batch.append(item)
        if len(self._batch) >= self.SIZE:
            self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        if self._pool is None:
            self._inline.extend(self._hasher.batch(self._batch))
        else:
            self._futures.append(self._pool.submit(self._hasher.batch, self._batch))
        self._batch = []

    def results(self) -> list[tuple[FileEntry, _Found | None]]:
        self._flush()
        try:
            return self._inline + [entry for future in self._futures for entry in future.result()]
        finally:
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            for future in self._futures:
                future.cancel()
            self._pool.shutdown(wait=True)


def digest_files(
    fs: AbstractFileSystem,
    found: Iterable[_Found],
    *,
    root: str = "",
    workers: int | None = None,
    digest_cache: DigestCache | None = None,
    progress: Progress | None = None,
) -> list[FileEntry]:
    """Entries for ``found`` (consumed lazily), taking unchanged files' digests from ``digest_cache``.

    Hashing runs on ``workers`` threads while ``found`` is still being walked.
    """
    cache = digest_cache if is_local(fs) else None
    snapshot = cache.snapshot(root) if cache is not None else {}
    # local reads are CPU-bound (one thread per core); remote ones wait on round trips
    hasher = _Hasher(fs, progress, cache, snapshot)
    batches = _Batches(hasher, workers or (default_workers() if is_local(fs) else REMOTE_WORKERS))
    try:
        for item in found:
            batches.add(item)
    except BaseException:
        batches.close()
        raise
    results = batches.results()
    if cache is not None:
        fresh = [(item, entry.digest) for entry, item in results if item is not None]
        cache.record(hits=len(results) - len(fresh), misses=len(fresh))
        cache.store(fresh)
    return [entry for entry, _ in results]


def build_manifest(
    source: str | os.PathLike[str],
    *,
    name: str,
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    digest_cache: DigestCache | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Walk and digest the dataset at ``source`` (a local path or any fsspec URL).

    ``digest_cache`` (local sources only) skips re-reading files whose path, size, mtime,
    ctime and inode are unchanged. ``progress(bytes, files)`` is called as files are done.
    Raises :class:`NotFound` if ``source`` does not exist, :class:`InvalidInput` for
    special files or broken links in it, :class:`SourceUnavailable` when reading fails.
    """
    check_dataset_name(name)
    fs, root = resolve(source, storage_options)
    empty_dirs: list[str] = []
    found = walk_source(fs, root, empty_dirs)
    with translate_errors(f"source {os.fspath(source)!r}"):
        entries = digest_files(fs, found, root=root, workers=workers, digest_cache=digest_cache, progress=progress)
    return Manifest.create(name, entries, directories=empty_dirs)


__all__ = [
    "BUNDLES_DIR",
    "CHUNK_SIZE",
    "BundleRef",
    "FileEntry",
    "FileHasher",
    "Manifest",
    "ManifestHeader",
    "Progress",
    "build_manifest",
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
