"""Bundles: a dataset's files packed into a few large tar+zstd objects in a bundle store.

Who calls it: ``dsctl pack / unpack`` and the agent (which fetches bundles one by one
with :func:`unpack_bundle`, re-exported here from :mod:`dsagent.format.bundles.extract`).

What it owns:

- **where bundles begin and end** (:func:`plan_bundles`, pure): content-defined on path
  hashes, so that one added, removed or changed file rewrites at most two bundles (the
  exact guarantee is in that function's docstring);
- **writing them** (:func:`pack`, :func:`write_bundles`): a POSIX tar (pax headers for
  long or non-ASCII names) as zstd frames, raw where zstd would not shrink the data
  (:mod:`dsagent.format.bundles.frames`), named ``bundles/<digest>.tar.zst`` by the digest of its
  members, skipped when the store already holds it. One bundle is written by a pipeline
  (:mod:`dsagent.format.bundles.packwriter`, docs/design.md#bundles); several bundles are
  written in parallel, one per core;
- **the store's write order**: bundles first, the manifest last, each atomically (temp,
  fsync, rename on local disks; one PUT on object stores), so a reader never sees a
  manifest whose bundles are missing;
- **the pack's options** (:class:`BundleOptions`, :class:`PackOptions`): each default and
  its meaning, written once. Every writer takes them as one object or as keywords.

Decision: the options, like the manifest's records, are named tuples, not dataclasses:
``dataclasses`` and its per-class code generation cost every ``dsctl pack`` about 10 ms of
start-up (docs/design-native.md#start-up).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import xxhash

from dsagent.errors import InvalidInput
from dsagent.format import native
from dsagent.format.bundles.bundlecaps import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES
from dsagent.format.bundles.packparallel import SEGMENT_MIN_BYTES, compress_into
from dsagent.format.bundles.packwriter import BundleWriter, tar_header
from dsagent.format.bundles.storeobjects import named, store_new_bundle, store_object, stored_size
from dsagent.format.digester import build_manifest, is_local, list_files
from dsagent.format.digestpool import can_fork
from dsagent.format.entries import EntryTableBuilder, check_layout, new_entries, path_key
from dsagent.format.manifest import (
    BUNDLES_DIR,
    MANIFEST_THREADS,
    BundleRef,
    FileEntry,
    Manifest,
    Progress,
    bundle_digest,
    bundle_path,
    check_dataset_name,
    expect_total,
    manifest_path,
)
from dsagent.format.storage import resolve_local_first, translate_errors
from dsagent.format.storageconfig import Options
from dsplatform import cores

if TYPE_CHECKING:
    from fsspec.spec import AbstractFileSystem

    from dsagent.format.bundles.extract import create_empty_directories, unpack, unpack_bundle, verify_tree
    from dsagent.format.digestcache import DigestCache

#: The unpacking side, re-exported from :mod:`dsagent.format.bundles.extract` and imported on first
#: use (PEP 562): ``dsctl pack`` never loads the extractor.
_EXTRACT = frozenset({"create_empty_directories", "unpack", "unpack_bundle", "verify_tree"})


def __getattr__(name: str) -> Any:
    if name in _EXTRACT:
        from dsagent.format.bundles import extract

        return getattr(extract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: zstd level 1: JPEG-like payloads do not compress, so the fastest level loses nothing.
DEFAULT_LEVEL = 1


class BundleOptions(NamedTuple):
    """How bundles are cut and written: what :func:`write_bundles` takes, as this object or
    as keywords of the same names."""

    max_files: int = DEFAULT_MAX_FILES
    """At most this many files per bundle (:func:`plan_bundles`)."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """At most this many uncompressed bytes per bundle, unless the bundle is one larger file."""
    level: int = DEFAULT_LEVEL
    """The zstd compression level."""
    threads: int | None = None
    """zstd's worker count per bundle; None: all cores when one bundle is written at a time,
    else none (bundles are then written in parallel, one per core)."""
    storage_options: Options = None
    """Storage options of the source (fsspec's, or :class:`~dsagent.format.storageconfig.StoreOptions`)."""
    store_options: Options = None
    """Storage options of the bundle store."""
    progress: Progress | None = None
    """Called with ``(bytes, files)`` as files are packed; bundles the store already holds
    count at once."""


class PackOptions(NamedTuple):
    """How a dataset is packed: what :func:`pack` and :func:`pack_dataset` take, as this
    object or as keywords of the same names. Those of :class:`BundleOptions` (the same
    names, defaults and meanings), and ``digest_cache``, ``workers``, ``processes``."""

    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES
    level: int = DEFAULT_LEVEL
    threads: int | None = None
    storage_options: Options = None
    store_options: Options = None
    progress: Progress | None = None
    digest_cache: DigestCache | None = None
    """Digests of unchanged local files, reused instead of reading the files again; files
    hashed while packing are added to it."""
    workers: int | None = None
    """Threads hashing the files of a source that is not local, which is digested before it
    is packed (None: :data:`~dsagent.format.digester.REMOTE_WORKERS`)."""
    processes: int = 1
    """More than 1: a local source's bundles (averaging at least
    :data:`~dsagent.format.bundles.packparallel.SEGMENT_MIN_BYTES`) are written one at a
    time, each cut into this many segments packed by forked processes
    (:func:`~dsagent.format.bundles.packparallel.compress_into`): docs/design.md#bundles says
    when that pays."""


_Options = TypeVar("_Options", BundleOptions, PackOptions)


def _options(
    kind: type[_Options], options: BundleOptions | PackOptions | None, keywords: Mapping[str, Any]
) -> _Options:
    """``options`` (default: ``kind()``, every default; the other kind: the fields both
    have) with ``keywords`` set; an unknown keyword is a :class:`TypeError`, as for any
    function."""
    unknown = sorted(set(keywords) - set(kind._fields))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    if options is None:
        base = kind()
    elif isinstance(options, kind):
        base = options
    else:
        base = kind(**{name: getattr(options, name) for name in options._fields if name in kind._fields})
    return base._replace(**keywords)


# --------------------------------------------------------------------------- boundaries


def _gap_priorities(entries: Sequence[FileEntry]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(entry.path.encode("utf-8", "surrogateescape")) for entry in entries[:-1]]


def plan_bundles(
    entries: Sequence[FileEntry],
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    upto: Sequence[int] | None = None,
) -> list[tuple[int, int]]:
    """``(first, count)`` ranges that split ``entries`` (in path order) into bundles;
    ``upto``: the bytes before each entry and the total (``n + 1`` sums), when the caller has them.

    Scheme: each gap between two neighbouring entries gets a priority, the 64-bit xxh3 of
    the path before it, so it depends on that one path and nothing else. The gaps form a
    Cartesian tree (min-heap on priority); a gap's *domain* is the run of entries between
    the nearest gaps of smaller priority on either side. A gap is a boundary exactly when
    its domain holds more than ``max_files`` files or more than ``max_bytes`` bytes. So:

    - every bundle respects both caps, or is a single file larger than ``max_bytes``
      (the lowest-priority gap inside a bundle is not a boundary, and its domain is
      exactly that bundle);
    - a dataset under both caps is one bundle;
    - boundaries depend on paths and sizes only, never on contents, so changing a file's
      content (same size) rewrites exactly one bundle;
    - an edit only moves boundaries whose domain contains the edited file, or its own gap.
      Adding a file (no larger than the dataset's smallest file, e.g. any file when the
      count cap binds) rewrites at most two bundles; removing a file that is not the
      last of its bundle rewrites exactly one. Both hold for every input (tested over
      thousands of random datasets with binding caps).

    Where the bound does not hold: removing the *last* file of a bundle removes a
    boundary, and the gaps around it may then all have domains over a cap, so the merged
    region is re-split: usually one or two bundles, occasionally more. The same goes
    for adding a file larger than the smallest one, or resizing a file, when that
    pushes several nested domains over ``max_bytes`` at once (a file larger than
    ``max_bytes`` added in the middle of a bundle necessarily leaves three: the run
    before it, itself, the run after). At realistic scale (hundreds of files per bundle)
    this is about one edit in several hundred, and the tests check random edits of
    every kind there stay within two bundles.
    """
    if max_files < 1 or max_bytes < 1:
        raise InvalidInput("max_files and max_bytes must be at least 1")
    n = len(entries)
    if n == 0:
        return []
    prefix = upto if upto is not None else [0, *accumulate(e.size for e in entries)]
    if n <= max_files and prefix[n] <= max_bytes:
        return [(0, n)]  # no gap's domain (at most the whole) is over a cap: the tree is not needed
    cuts = None
    if native.AVAILABLE:  # the same rule in C: 0.1 s of a 200,000-file pack's serial time otherwise
        cuts = native.plan_cuts(
            list(map(path_key, entries)), list(prefix), min(max_files, n), min(max_bytes, prefix[n])
        )
    if cuts is None:
        priority = _gap_priorities(entries)
        left, right = _nearest_smaller(priority, n)
        cuts = [
            g for g in range(n - 1)
            if right[g] - left[g] > max_files or prefix[right[g] + 1] - prefix[left[g] + 1] > max_bytes
        ]  # fmt: skip
    bounds = [-1, *cuts, n - 1]
    return [(bounds[i] + 1, bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]


def largest_first(todo: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """The bundles ``todo`` (indexes into ``sizes``, their bytes) in the order to write them
    on several threads: largest first (plan order among equals), so the last to start are
    the small ones and no thread works alone for long at the end. 200,000 files of 4 KB in
    9 bundles of 19 to 160 MB on two threads: the larger of the two threads' shares is 503
    MB, against 567 MB taken in plan order."""
    return sorted(todo, key=lambda i: sizes[i], reverse=True)


def _nearest_smaller(priority: Sequence[int], n: int) -> tuple[list[int], list[int]]:
    """For each gap, the nearest gap with a smaller priority on its left (-1: none) and on
    its right (``n - 1``: none), both from one pass with a stack.

    Ties are broken by position (a gap of equal priority on the left counts as smaller, one
    on the right does not) so the tree is well defined even if two paths share a 64-bit
    hash. A gap is popped by the first gap to its right of strictly smaller priority, which
    is its right neighbour in the tree; what stays below it is its left one.
    """
    left = [-1] * len(priority)
    right = [n - 1] * len(priority)
    stack: list[int] = []
    for g, p in enumerate(priority):
        while stack and priority[stack[-1]] > p:
            right[stack.pop()] = g
        if stack:
            left[g] = stack[-1]
        stack.append(g)
    return left, right


# --------------------------------------------------------------------------- writing


def write_bundles(
    manifest: Manifest,
    source: str | os.PathLike[str],
    store: str | os.PathLike[str],
    options: BundleOptions | PackOptions | None = None,
    **keywords: Any,
) -> tuple[Manifest, int]:
    """Write ``manifest``'s bundles (those the store lacks) and then the manifest.

    Returns the manifest with its bundle index and the number of bundles reused.
    ``options`` (:class:`BundleOptions`), or its fields as ``keywords``, say how.
    """
    opts = _options(BundleOptions, options, keywords)
    progress, level, store_options = opts.progress, opts.level, opts.store_options
    src_fs, src_root = resolve_local_first(source, opts.storage_options)
    dst_fs, dst_root = resolve_local_first(store, store_options)
    plan = plan_bundles(manifest.entries, opts.max_files, opts.max_bytes)
    groups = [manifest.entries[first : first + count] for first, count in plan]
    expect_total(progress, manifest.total_bytes, manifest.file_count)
    digests = [bundle_digest(group) for group in groups]
    with translate_errors(f"bundle store {os.fspath(store)!r}", fs=dst_fs, path=dst_root):
        _prepare_directory(dst_fs, f"{dst_root.rstrip('/')}/{BUNDLES_DIR}")
        existing = {
            digest: size
            for digest in set(digests)
            if (size := stored_size(dst_fs, bundle_path(dst_root, digest))) is not None
        }
    todo = [i for i, digest in enumerate(digests) if digest not in existing]
    if progress is not None:
        reused = [g for g, d in zip(groups, digests) if d in existing]
        if reused:
            progress(sum(e.size for g in reused for e in g), sum(len(g) for g in reused))
    cpus = cores.usable()
    parallel = max(1, min(len(todo), cpus))
    zstd_threads = opts.threads if opts.threads is not None else (cpus if parallel == 1 and cpus > 1 else 0)
    writer = BundleWriter(src_fs, src_root, progress, threading.Lock(), native.spare_cores(parallel))
    sizes = dict(existing)

    def write_one(i: int) -> None:
        path = bundle_path(dst_root, digests[i])
        with translate_errors(f"bundle {digests[i]} in {os.fspath(store)!r}"):
            sizes[digests[i]] = store_object(dst_fs, path, compress_into(groups[i], writer, level, zstd_threads))

    if parallel == 1:
        for i in todo:
            write_one(i)
    else:
        with ThreadPoolExecutor(parallel, thread_name_prefix="dsagent-pack") as pool:
            list(pool.map(write_one, largest_first(todo, [sum(e.size for e in group) for group in groups])))
    refs = [
        BundleRef(digest, first, count, sum(e.size for e in group), sizes[digest])
        for (first, count), group, digest in zip(plan, groups, digests)
    ]  # fmt: skip
    packed = manifest.with_bundles(refs)
    write_manifest(packed, store, store_options=store_options)
    packed = _keep_reused(packed, set(existing), src_fs, src_root, dst_fs, dst_root, store, level, store_options)
    return packed, len(plan) - len(todo)


def _keep_reused(
    packed: Manifest,
    reused: set[str],
    src_fs: AbstractFileSystem,
    src_root: str,
    dst_fs: AbstractFileSystem,
    dst_root: str,
    store: str | os.PathLike[str],
    level: int,
    store_options: Options,
) -> Manifest:
    """After the manifest, check once more that the bundles this pack reused (rather than
    wrote) are still in the store: a concurrent ``dsctl gc`` may have moved an old orphan
    aside between this pack's look and its manifest (docs/design.md#store-gc). One missing
    is written again from the source (each file's digest checked), and the manifest again
    when its compressed size changed. One size request per reused bundle."""
    refs = list(packed.bundles)
    changed = False
    writer = BundleWriter(src_fs, src_root, None, threading.Lock())
    for k, ref in enumerate(refs):
        if ref.digest not in reused:
            continue
        path = bundle_path(dst_root, ref.digest)
        with translate_errors(f"bundle {ref.digest} in {os.fspath(store)!r}"):
            if stored_size(dst_fs, path) is not None:
                continue
            members = packed.entries[ref.first : ref.first + ref.count]
            size = store_object(dst_fs, path, compress_into(members, writer, level, 0))
        if size != ref.compressed_size:
            refs[k] = BundleRef(ref.digest, ref.first, ref.count, ref.size, size)
            changed = True
    if changed:
        packed = packed.with_bundles(refs)
        write_manifest(packed, store, store_options=store_options)
    return packed


def write_manifest(manifest: Manifest, store: str | os.PathLike[str], *, store_options: Options = None) -> None:
    """Store ``manifest`` as ``<store>/<name>/manifest``, atomically; call it after its bundles."""
    fs, root = resolve_local_first(store, store_options)
    path = manifest_path(root, manifest.name)
    data = manifest.to_bytes(threads=MANIFEST_THREADS)
    with translate_errors(f"manifest of {manifest.name!r} in {os.fspath(store)!r}"):
        _prepare_directory(fs, path.rpartition("/")[0])
        store_object(fs, path, lambda raw: raw.write(data))


#: Filesystems whose first path component is a bucket (container): ``mkdir`` there creates
#: one, so packing into a mistyped bucket would silently create it.
_BUCKET_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "cos"}


def _prepare_directory(fs: Any, directory: str) -> None:
    """Create ``directory`` where directories exist; on object stores check that the bucket
    exists instead, and never create it (a missing bucket is :class:`NotFound`)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & _BUCKET_PROTOCOLS:
        fs.makedirs(directory, exist_ok=True)
        return
    bucket = fs._strip_protocol(directory).strip("/").split("/", 1)[0]
    try:
        fs.info(bucket)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"bucket {bucket!r} does not exist (create it first: packing never creates buckets)"
        ) from exc


def pack(
    source: str | os.PathLike[str],
    store: str | os.PathLike[str],
    options: PackOptions | None = None,
    *,
    name: str,
    **keywords: Any,
) -> Manifest:
    """Digest ``source`` and pack it into ``store`` as dataset ``name``; returns the manifest.

    :func:`pack_dataset`, with the same options, without the count of reused bundles.
    """
    return pack_dataset(source, store, options, name=name, **keywords)[0]


def _span(bundle: tuple[int, int]) -> slice:
    """The entries of a planned ``(first, count)`` bundle."""
    first, count = bundle
    return slice(first, first + count)


def pack_dataset(
    source: str | os.PathLike[str],
    store: str | os.PathLike[str],
    options: PackOptions | None = None,
    *,
    name: str,
    **keywords: Any,
) -> tuple[Manifest, int]:
    """Pack ``source`` into ``store`` as dataset ``name``: the manifest and the number of bundles reused.

    ``options`` (:class:`PackOptions`), or its fields as ``keywords``, say how.

    A local source is packed in one pass (docs/design.md#bundles): the tree is listed and
    stat'ed, bundles are planned from paths and sizes (:func:`plan_bundles` needs no
    digests), and each file is read once, hashed while its bytes go into its bundle; the
    manifest is built from those hashes. A file whose size or mtime moves while it is
    read is an error (:class:`IntegrityError`), as it was between the two passes. With
    ``digest_cache``, a bundle whose files all have cached digests (unchanged size, mtime,
    inode, ctime) and which the store already holds is reused without reading a byte; its
    other bundles are written into a temporary object and named once written (a bundle the
    store turns out to hold is dropped, not replaced). Files hashed while packing go into
    the cache.

    Other sources are digested first and then packed (:func:`write_bundles`): re-packing
    an unchanged remote source in one pass would upload every bundle again only to find
    that the store holds it, and remote sources have no digest cache to avoid that.
    """
    opts = _options(PackOptions, options, keywords)
    progress, digest_cache, level, store_options = opts.progress, opts.digest_cache, opts.level, opts.store_options
    check_dataset_name(name)
    src_fs, src_root = resolve_local_first(source, opts.storage_options)
    empty: list[str] = []
    files = None
    if is_local(src_fs):
        with translate_errors(f"source {os.fspath(source)!r}"):
            files = list_files(src_fs, src_root, empty)
    if files is None:
        manifest = build_manifest(
            source, name=name, storage_options=opts.storage_options, workers=opts.workers, digest_cache=digest_cache
        )
        return write_bundles(manifest, source, store, opts)
    paths, sizes_listed, mtimes = files.paths, files.sizes, files.mtimes  # the listing's columns: no object a file
    listed = list(new_entries(paths, sizes_listed, mtimes, repeat("")))
    upto = [0, *accumulate(sizes_listed)]  # bytes before each entry: any range's size at once
    expect_total(progress, upto[-1], len(listed))
    directories = sorted(set(empty))
    check_layout(paths, directories)  # before any bundle is written
    snapshot = digest_cache.snapshot(src_root) if digest_cache is not None else None
    known: list[str | None] = (
        snapshot.known(paths, sizes_listed, mtimes, files.inodes, files.ctimes)
        if snapshot is not None
        else [None] * len(files)
    )
    plan = plan_bundles(listed, opts.max_files, opts.max_bytes, upto)
    dst_fs, dst_root = resolve_local_first(store, store_options)
    digests: list[str | None] = []
    for first, count in plan:
        cached = known[first : first + count]
        digests.append(None if None in cached else bundle_digest(named(listed[first : first + count], cached)))  # type: ignore[arg-type]
    with translate_errors(f"bundle store {os.fspath(store)!r}", fs=dst_fs, path=dst_root):
        _prepare_directory(dst_fs, f"{dst_root.rstrip('/')}/{BUNDLES_DIR}")
        sizes = {
            digest: size
            for digest in digests
            if digest is not None and (size := stored_size(dst_fs, bundle_path(dst_root, digest))) is not None
        }
    todo = [i for i, digest in enumerate(digests) if digest not in sizes]
    if progress is not None and len(todo) < len(plan):
        writing = set(todo)
        reused = [plan[i] for i in range(len(plan)) if i not in writing]
        progress(sum(upto[first + count] - upto[first] for first, count in reused), sum(c for _, c in reused))
    cpus = cores.usable()
    parallel = max(1, min(len(todo), cpus))
    writing_bytes = sum(upto[plan[i][0] + plan[i][1]] - upto[plan[i][0]] for i in todo)
    processes = opts.processes
    if processes > 1 and todo and writing_bytes >= len(todo) * SEGMENT_MIN_BYTES and can_fork():
        parallel = 1  # large bundles: one at a time, each cut into segments packed by forked processes
    else:
        processes = 1
    zstd_threads = opts.threads if opts.threads is not None else (cpus if parallel == 1 and cpus > 1 else 0)
    # the files of the bundles (or segments) packed at once read on the cores left to each
    writer = BundleWriter(src_fs, src_root, progress, threading.Lock(), native.spare_cores(parallel * processes))
    written: list[int] = []  # bundles the store did not hold (one packed again but found there is reused)
    read_digests: dict[int, bytes] = {}  # a packed bundle's member digests as read, 16 raw bytes each
    scratch = f"{dst_root.rstrip('/')}/{BUNDLES_DIR}" if is_local(dst_fs) else None

    def write_one(i: int) -> None:
        first, count = plan[i]
        members = listed[first : first + count]
        fill = compress_into(members, writer, level, zstd_threads, processes=processes, scratch=scratch)
        with translate_errors(f"a new bundle in {os.fspath(store)!r}"):
            digest, size, read, new = store_new_bundle(dst_fs, dst_root, members, fill)
        digests[i] = digest
        sizes[digest] = size
        read_digests[i] = read
        if new:
            written.append(i)

    if parallel == 1:
        for i in todo:
            write_one(i)
    else:
        with ThreadPoolExecutor(parallel, thread_name_prefix="dsagent-pack") as pool:
            list(pool.map(write_one, largest_first(todo, [upto[first + count] - upto[first] for first, count in plan])))
    table = EntryTableBuilder()  # columns, not an object a file: ~1 us each at 200,000 files
    for i, bundle in enumerate(plan):
        span = _span(bundle)
        if i in read_digests:
            table.add_raw(paths[span], sizes_listed[span], mtimes[span], read_digests[i])
        else:  # a bundle the store held, named by the digest cache's digests
            table.add(paths[span], sizes_listed[span], mtimes[span], known[span])  # type: ignore[arg-type]
    entries = table.build()
    refs = []
    for (first, count), digest in zip(plan, digests):
        assert digest is not None
        refs.append(BundleRef(digest, first, count, upto[first + count] - upto[first], sizes[digest]))
    packed = Manifest.of_checked_layout(name, entries, directories=directories, bundles=refs)
    write_manifest(packed, store, store_options=store_options)
    kept = {digests[i] for i in range(len(plan)) if i not in set(written)}
    packed = _keep_reused(packed, kept, src_fs, src_root, dst_fs, dst_root, store, level, store_options)  # type: ignore[arg-type]
    if digest_cache is not None:
        assert snapshot is not None
        hashed = sum(plan[i][1] for i in todo)
        digest_cache.record(hits=len(files) - hashed, misses=hashed)
        digest_cache.store(snapshot, paths, sizes_listed, mtimes, files.inodes, files.ctimes, entries.digests)
    return packed, len(plan) - len(written)


__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "BundleOptions",
    "PackOptions",
    "create_empty_directories",
    "pack",
    "pack_dataset",
    "plan_bundles",
    "tar_header",
    "unpack",
    "unpack_bundle",
    "verify_tree",
    "write_bundles",
    "write_manifest",
]
