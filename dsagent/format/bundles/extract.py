"""Verified, safe extraction of bundles into a local directory (and :func:`verify_tree`, re-exported).

Who calls it: :func:`dsagent.format.bundles.bundle.unpack` users (``dsctl unpack``) and the agent, which
calls :func:`unpack_bundle` once per bundle so that after a crash the bundles already
verified are not fetched again.

What it owns: streaming a bundle from any fsspec store through zstd into tar extraction,
hashing every file while it is written (no second read), refusing anything unsafe, and
the durability of what it leaves behind:

- a bundle is extracted into a private staging directory inside the target
  (``.dsagent-staging/``), each file created with ``O_EXCL | O_NOFOLLOW``;
- members must be regular files the manifest lists for *this* bundle, each once, with
  the listed size and digest; absolute paths, ``..``, symlinks, hard links, devices,
  FIFOs, directories, sparse or unlisted members raise :class:`UnsafeArchive`, a bad
  digest, a missing member or a truncated/corrupt stream :class:`IntegrityError`;
- only when the whole bundle verified are its files synced, renamed into place (with the
  manifest's mtimes) and synced again; on any error the staging directory is removed and
  nothing of that bundle is left in the target.
- :func:`unpack` writes into a private stage of the whole dataset (renamed to the target
  once, removed whole on any error), so there each file is written at its path directly
  (``in_place``): no per-bundle staging directory and no rename per file, as ``tar -x``.
- the member loop runs in C when the optional extension is built
  (:mod:`dsagent.format.native`; the same files, the same refusals and messages).

Durability uses ``syncfs`` on the target's filesystem: one call instead of an ``fsync``
per small file, at the price of also flushing other writers' dirty pages on that
filesystem (on a node's cache disk, mostly the agent's own concurrent fetches).
Writeback starts in the background every few tens of MB written into the filesystem
(:class:`~dsagent.format.durable.Writeback`), so the disk works while the rest of the
bundle is extracted and the ``syncfs`` only waits for the tail. The bundle's stream is
decompressed a few chunks ahead on its own thread (:class:`~dsagent.format.framereader.FrameReader`,
``UNPACK_AHEAD``) while this thread parses, hashes and writes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING

import xxhash

from dsagent.errors import (
    Conflict,
    IntegrityError,
    InvalidInput,
    UnsafeArchive,
    is_full_disk,
    local_write_error,
)
from dsagent.format import native as native_loops
from dsagent.format.bundles.staging import STAGING_DIR, Staging, ensure_real_dir, publish
from dsagent.format.durable import Writeback, WritebackError, syncfs, writeback_for
from dsagent.format.framereader import FrameReader
from dsagent.format.manifest import (
    BundleRef,
    EntryTable,
    FileEntry,
    Manifest,
    Progress,
    bundle_path,
    is_safe_path,
    read_manifest,
)
from dsagent.format.oneversion import open_one_version
from dsagent.format.storage import local_path, resolve, translate_errors
from dsagent.format.storageconfig import Options
from dsagent.format.tarstream import MAX_TAIL, iter_members, read_data, tar_bound
from dsagent.format.verify import verify_tree
from dsplatform import cores

if TYPE_CHECKING:
    import tarfile

#: the most threads decoding one bundle's frames (:func:`frame_decoders`)
FRAME_DECODERS_MAX = 8
#: Unpack pipeline: decompressed chunks (of about ``CHUNK_SIZE``) a bundle's reader thread may
#: hold ahead of the thread that parses, hashes and writes the files.
UNPACK_AHEAD = 2

__all__ = [
    "STAGING_DIR",
    "create_empty_directories",
    "frame_decoders",
    "member_writers",
    "unpack",
    "unpack_bundle",
    "unpack_bundle_stream",
    "verify_tree",
]


# --------------------------------------------------------------------------- member checks


def _reject_unsafe(member: tarfile.TarInfo, bundle: BundleRef) -> None:
    import tarfile  # loaded by the member loop that parsed ``member`` (tarstream.iter_members)

    where = f"bundle {bundle.digest}: member {member.name!r}"
    if member.issym() or member.islnk():
        raise UnsafeArchive(f"{where} is a link", hint="bundles hold regular files only")
    if member.ischr() or member.isblk() or member.isfifo():
        raise UnsafeArchive(f"{where} is a device or FIFO", hint="bundles hold regular files only")
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise UnsafeArchive(f"{where} is not a regular file (type {member.type!r})")
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"{where} has an absolute path")
    if not is_safe_path(name):
        raise UnsafeArchive(f"{where} escapes or is not a clean relative path")


def _write_member(chunks: Iterator[memoryview], fd: int, entry: FileEntry, what: str, writeback: Writeback) -> None:
    state = xxhash.xxh3_128()
    write, update = os.write, state.update
    for chunk in chunks:
        update(chunk)
        while chunk:
            chunk = chunk[write(fd, chunk) :]
    if state.hexdigest() != entry.digest:
        raise IntegrityError(
            f"{what}: {entry.path!r} does not match its digest",
            hint="the bundle is corrupt or was tampered with; re-pack the dataset",
        )
    os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
    writeback.written(fd, entry.size)


def _extract_stream(
    raw: IO[bytes], members: EntryTable, bundle: BundleRef, staging: Staging, progress: Progress | None,
    native: bool, decoders: int = 0, writers: int = 1,
) -> None:  # fmt: skip
    what = f"bundle {bundle.digest}"
    # from the columns: an entry is built as a FileEntry only when its member arrives
    expected = {path: i for i, path in enumerate(members.paths)}
    seen: set[str] = set()
    bound = tar_bound(zip(members.sizes, (len(p.encode("utf-8", "surrogateescape")) for p in members.paths)))
    with FrameReader(raw, what, limit=bound, ahead=UNPACK_AHEAD, frames=True, decoders=decoders) as reader:
        loop = _Members(reader, members, bundle, staging, progress, expected, seen)
        if native:
            loop.native(writers)
        else:
            loop.rest()
        reader.drain(MAX_TAIL)  # the tar writer's zero padding after its end
    if len(seen) != len(expected):
        missing = sorted(expected.keys() - seen)
        raise IntegrityError(f"{what} lacks {len(missing)} listed file(s), e.g. {missing[0]!r}")


class _Members:
    """One bundle's member loop: the pure-Python one (:meth:`rest`), or the native one
    (:meth:`native`), which leaves every member it cannot take whole to :meth:`one`."""

    def __init__(
        self, reader: FrameReader, members: EntryTable, bundle: BundleRef, staging: Staging,
        progress: Progress | None, expected: dict[str, int], seen: set[str],
    ) -> None:  # fmt: skip
        self.reader, self.members, self.bundle, self.staging = reader, members, bundle, staging
        self.progress, self.expected, self.seen = progress, expected, seen
        self.what = f"bundle {bundle.digest}"
        self.writeback = writeback_for(staging.root)

    def one(self) -> int | None:
        """The next member parsed, checked and written; its index, or None at the archive's end."""
        what, reader = self.what, self.reader
        member = next(iter_members(reader, what), None)
        if member is None:
            return None
        _reject_unsafe(member, self.bundle)
        index = self.expected.get(member.name)
        if index is None:
            raise UnsafeArchive(f"{what}: member {member.name!r} is not listed in the manifest for this bundle")
        if member.name in self.seen:
            raise UnsafeArchive(f"{what}: member {member.name!r} appears twice")
        entry = self.members[index]
        if member.size != entry.size:
            raise IntegrityError(f"{what}: {member.name!r} has {member.size} bytes, the manifest says {entry.size}")
        self.seen.add(member.name)
        fd = self.staging.create(index)
        try:
            _write_member(read_data(reader, member.size, what), fd, entry, what, self.writeback)
        finally:
            os.close(fd)
        if self.progress is not None:
            self.progress(entry.size, 1)
        return index

    def rest(self) -> None:
        """The pure-Python loop, to the end of the archive."""
        while self.one() is not None:
            pass

    def native(self, writers: int = 1) -> None:
        """The C loop (:func:`dsagent.format.native.extract_members`), to the end of the archive,
        the members whole in a chunk written on ``writers`` threads."""
        dir_fd = os.open(self.staging.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            native_loops.extract_members(
                self.reader, dir_fd, self.members, self.what, seen=self.seen, one_member=self.one, rest=self.rest,
                written=lambda nbytes: self.writeback.written(dir_fd, nbytes), progress=self.progress,
                path=self.staging.path, by_name=self.staging.in_place, writers=writers,
            )  # fmt: skip
        finally:
            os.close(dir_fd)


@contextmanager
def _local_writes(dest: str) -> Iterator[None]:
    """A full disk is :class:`InsufficientSpace`; any other local write failure is the
    cache disk's (:class:`CacheDiskError`, not the source's) and says where it happened."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, WritebackError) and not is_full_disk(exc):
            # written data may be lost: nothing of it is kept
            raise IntegrityError(
                f"flushing {dest} to disk failed: {exc}", hint="the cache disk reported a write error (see dmesg)"
            ) from exc
        raise local_write_error(exc, f"unpacking into {dest}") from exc


def unpack_bundle(
    store: str | os.PathLike[str],
    manifest: Manifest,
    bundle: BundleRef,
    dest_dir: str | os.PathLike[str],
    *,
    storage_options: Options = None,
    progress: Progress | None = None,
    durable: bool = True,
    native: bool | None = None,
    in_place: bool = False,
    decoders: int = 0,
    writers: int = 1,
) -> None:
    """Extract one bundle's files into the existing directory ``dest_dir``, verified.

    With ``durable`` (the default) the bundle's files are on disk when this returns
    (one ``syncfs`` before and one after the renames); :func:`unpack` turns it off per
    bundle and syncs once for the whole dataset before publishing it.

    On any error nothing of this bundle is left in ``dest_dir`` and the error is raised:
    :class:`UnsafeArchive` for a member that must not be written, :class:`IntegrityError`
    for a digest mismatch or a truncated or corrupt bundle, :class:`NotFound` /
    :class:`SourceUnavailable` when the store cannot be read.
    """
    local = local_path(store, storage_options)
    with translate_errors(f"bundle {bundle.digest} in {os.fspath(store)!r}"):
        if local is not None:  # without fsspec (see local_path)
            raw: IO[bytes] = open(bundle_path(local, bundle.digest), "rb")  # noqa: SIM115 - closed below
        else:
            fs, root = resolve(store, storage_options)
            raw = open_one_version(fs, bundle_path(root, bundle.digest), size=bundle.compressed_size)
        with raw:
            unpack_bundle_stream(
                raw, manifest, bundle, dest_dir, progress=progress, durable=durable, native=native, in_place=in_place,
                decoders=decoders, writers=writers,
            )  # fmt: skip


def unpack_bundle_stream(
    raw: IO[bytes],
    manifest: Manifest,
    bundle: BundleRef,
    dest_dir: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    durable: bool = True,
    native: bool | None = None,
    in_place: bool = False,
    decoders: int = 0,
    writers: int = 1,
) -> None:
    """:func:`unpack_bundle` from an already open stream of the bundle's bytes (a peer's
    response, read as it arrives): the same checks, the same all-or-nothing result.
    What ``raw.read`` raises passes through unchanged.

    ``native`` picks the member loop: ``None`` the C one when the extension is built
    (:mod:`dsagent.format.native`), ``False`` the pure-Python one, ``True`` the C one or
    :class:`RuntimeError` when it is not built. Both write the same files and raise the
    same errors. ``in_place`` writes each file at its path in ``dest_dir`` (no staging, no
    renames), for a caller whose ``dest_dir`` is a private stage it removes whole on any
    error (:func:`unpack`): then an error leaves part of the bundle there. ``decoders``:
    threads that decode the bundle's frames ahead of the member loop (0: the one reading
    thread; :func:`frame_decoders`); ``writers``: threads that write the C loop's files
    (:func:`member_writers`)."""
    native = native_loops.chosen(native)
    dest = os.fspath(dest_dir)
    if not os.path.isdir(dest):
        raise InvalidInput(f"unpack target {dest} is not a directory")
    members = EntryTable.of(manifest.bundle_entries(bundle))
    with _local_writes(dest):
        staging = Staging(dest, bundle, members if in_place else None)
        writeback = writeback_for(staging.root)
        since = writeback.mark()
    try:
        with _local_writes(dest):  # errors writing the target are not the source's
            _extract_stream(raw, members, bundle, staging, progress, native, decoders, writers)
            if not in_place:
                publish(staging, dest, members, durable)
            elif durable:
                syncfs(dest)
            if durable:
                writeback.check(since)  # a background flush's error is not the last syncfs's
    finally:
        staging.remove()


def frame_decoders(at_once: int) -> int:
    """Threads to decode the frames of each of ``at_once`` bundles unpacked together: the
    cores left beside their member loops and readers, at most :data:`FRAME_DECODERS_MAX`;
    0 (one reading thread decodes) where fewer than two are left."""
    spare = native_loops.spare_cores(at_once) - 2  # each bundle's cores, as the pack shares them out
    return min(FRAME_DECODERS_MAX, spare) if spare >= 2 else 0


def member_writers(at_once: int) -> int:
    """Threads to write the files of each of ``at_once`` bundles unpacked together (the C
    loop's own among them): the cores left beside their frame decoders and readers, and at
    least two, since a small file's create, write, date and close are the kernel's work, one
    after another on a thread, while its reader only hands on decompressed bytes."""
    return max(2, native_loops.spare_cores(at_once) - frame_decoders(at_once) - 1)


def _plain(path: str | os.PathLike[str]) -> str:
    """``path`` as :class:`pathlib.Path` writes it: no empty or ``.`` parts, ``..`` kept (a
    symlink before it decides where it leads), ``.`` for nothing."""
    raw = os.fspath(path)
    joined = "/".join(part for part in raw.split("/") if part not in ("", "."))
    return ("/" + joined if raw.startswith("/") else joined) or "."


def create_empty_directories(manifest: Manifest, dest_dir: str | os.PathLike[str]) -> None:
    """Create the manifest's empty directories under ``dest_dir`` (after its bundles)."""
    dest = os.fspath(dest_dir)
    made: set[str] = {""}
    for directory in manifest.directories:
        ensure_real_dir(dest, directory, made)


def _locked(progress: Progress | None) -> Progress | None:
    """``progress`` made safe to call from several unpacking threads."""
    if progress is None:
        return None
    lock = threading.Lock()

    def report(done_bytes: int, files: int) -> None:
        with lock:
            progress(done_bytes, files)

    return report


#: What an unpacking job reads: the store, the manifest, the stage, the storage options and
#: the choice of member loop.
_Job = tuple[str | os.PathLike[str], Manifest, str, Options, bool | None]
#: The job the forked unpacking processes share with their parent (:func:`_in_processes`):
#: set just before they are forked, so that a task is only a bundle's index.
_FORKED: _Job | None = None


def _unpack_forked(index: int) -> None:
    assert _FORKED is not None
    store, manifest, stage, storage_options, native = _FORKED
    writeback = writeback_for(stage)  # this process's own background flushes: their errors are checked here
    since = writeback.mark()
    unpack_bundle(
        store, manifest, manifest.bundles[index], stage, storage_options=storage_options, durable=False, native=native,
        in_place=True,
    )  # fmt: skip
    with _local_writes(stage):
        writeback.check(since)


def _in_processes(job: _Job, progress: Progress | None, count: int) -> None:
    """Bundles unpacked by ``count`` forked processes: the per-file work (parsing, hashing,
    creating and renaming files) holds the GIL, so threads would take turns on it.
    Progress is counted a bundle at a time, as each one is published."""
    global _FORKED
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    _FORKED = job
    manifest = job[1]
    try:
        with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_unpack_forked, i): bundle for i, bundle in enumerate(manifest.bundles)}
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for future in done:
                        future.result()  # the first failure decides
                        if progress is not None:
                            progress(futures[future].size, futures[future].count)
            except BaseException:
                for future in pending:
                    future.cancel()
                raise
    except BrokenProcessPool as exc:
        raise IntegrityError(
            f"an unpacking process of dataset {manifest.name!r} died", hint="see the system log (out of memory?)"
        ) from exc
    finally:
        _FORKED = None


def _unpack_bundles(
    store: str | os.PathLike[str],
    manifest: Manifest,
    stage: str,
    storage_options: Options,
    progress: Progress | None,
    count: int,
    native: bool | None = None,
    writers: int | None = None,
) -> None:
    """Every bundle of ``manifest`` into ``stage``: one after another, in forked processes
    where this process may fork (Linux, no other thread), else on threads. ``writers``: the
    threads writing each bundle's files when they go one after another (None:
    :func:`member_writers`)."""
    if count <= 1 or len(manifest.bundles) <= 1:
        decoders = frame_decoders(1)  # one bundle at a time: the spare cores decode its frames
        writers = member_writers(1) if writers is None else writers  # and write its files
        for bundle in manifest.bundles:
            unpack_bundle(
                store, manifest, bundle, stage, storage_options=storage_options, progress=progress, durable=False,
                native=native, in_place=True, decoders=decoders, writers=writers,
            )  # fmt: skip
        return
    from dsagent.format.digestpool import can_fork  # here: bundles one at a time never fork

    if can_fork():
        _in_processes((store, manifest, stage, storage_options, native), progress, min(count, len(manifest.bundles)))
        return
    from concurrent.futures import ThreadPoolExecutor  # here: bundles one at a time, or forked, need no pool

    shared = _locked(progress)
    with ThreadPoolExecutor(count, thread_name_prefix="dsagent-unpack") as pool:
        futures = [
            pool.submit(
                unpack_bundle, store, manifest, b, stage, storage_options=storage_options, progress=shared,
                durable=False, native=native, in_place=True,
            )
            for b in manifest.bundles
        ]  # fmt: skip
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:  # the first failure decides; do not unpack the rest
                future.cancel()
            raise


def unpack(
    store: str | os.PathLike[str],
    *,
    name: str,
    dest: str | os.PathLike[str],
    manifest: Manifest | None = None,
    workers: int | None = None,
    storage_options: Options = None,
    progress: Progress | None = None,
    native: bool | None = None,
    writers: int | None = None,
) -> Manifest:
    """Unpack dataset ``name`` from ``store`` into the new directory ``dest``, verifying everything.

    Works in a sibling staging directory and renames it to ``dest`` only when every
    bundle verified; ``dest`` must not exist or be empty (:class:`Conflict` otherwise).
    Bundles are extracted ``workers`` at a time (default: one per core, at most 4), each
    in its own forked process where this process may fork (:func:`_unpack_bundles`).
    ``native``: see :func:`unpack_bundle_stream`. ``writers``: the threads writing the
    files of a bundle unpacked alone (default: :func:`member_writers`).
    """
    manifest = manifest or read_manifest(os.fspath(store), name, storage_options=storage_options)
    if manifest.entries and not manifest.bundles:
        raise InvalidInput(f"dataset {manifest.name!r} has a manifest but no bundles", hint="pack it with 'dsctl pack'")
    target = _plain(dest)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise Conflict(f"unpack target {target} exists and is not empty", hint="remove it or choose another directory")
    parent = os.path.dirname(target) or "."
    os.makedirs(parent, exist_ok=True)
    stage = f"{parent}/.{os.path.basename(target)}.staging-{os.urandom(4).hex()}"
    os.mkdir(stage)
    since = writeback_for(stage).mark()
    try:
        count = workers or min(4, cores.usable())
        _unpack_bundles(store, manifest, stage, storage_options, progress, count, native, writers)
        create_empty_directories(manifest, stage)
        with _local_writes(stage):
            syncfs(stage)
            writeback_for(stage).check(since)
        if os.path.exists(target):
            os.rmdir(target)
        os.replace(stage, target)
        syncfs(parent)
    except BaseException:
        import shutil  # here: only a failed unpack removes its stage

        shutil.rmtree(stage, ignore_errors=True)
        raise
    return manifest
