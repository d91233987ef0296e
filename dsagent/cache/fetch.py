"""Getting one dataset version into its staging directory: bundles or per-file copies.

Who calls it: :mod:`dsagent.cache.versions`, which owns the staging directory, the catalog and
the concurrency limits, and passes in an executor and a worker count (docs/design.md#rule-6).
What it owns: the two fetch paths and their progress counters.

- **Packed** (the source has a manifest in a bundle store): each bundle is downloaded and
  unpacked by :func:`dsagent.format.bundles.bundle.unpack_bundle`, which verifies every file while
  writing; bundles already verified before a crash are skipped (the service tells us
  which), and a bundle interrupted by a crash is cleared before it is fetched again.
  A bundle from the store is written in place: each file straight at its path in the
  version's staging directory (``in_place``, as ``tar -x``), not into a per-bundle stage
  whose files are then renamed one by one. The version's staging directory is itself the
  private stage (renamed into place whole once every bundle verified), and a bundle is
  recorded done only after its files verified and a ``syncfs`` made them durable, so the
  per-bundle stage bought nothing the record does not: what it cost was a ``rename`` per
  file and a second ``syncfs`` per bundle, 0.34 s of 5.1 s for 20,000 files (17 us a
  file) on the development disk. What an interrupted or failed attempt leaves is
  unrecorded: the bundle's files are removed before it is tried again (over another
  link, or by a resumed fetch), so a retry never meets its own half-written files.
- **Per-file** (no bundle store): every file is copied from the source while its xxh3-128
  is computed, then checked against the manifest the service resolved, so the digest
  recorded for the copy is the digest of what was written.

Blocking work (fsspec, zstd, tar, hashing, fsync) runs in the executor, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from dsagent.cache.fetchlinks import (
    DEFAULT_ROUTE,
    LINK_ERRORS,
    NOT_LINK_ERRORS,
    Lease,
    LinkSet,
    bound_options,
    can_bind,
)
from dsagent.cache.fetchranges import RangesUnsupported, range_plan, unpack_ranged
from dsagent.cache.progress import FetchProgress
from dsagent.errors import InsufficientSpace, IntegrityError, InvalidInput, is_full_disk, local_write_error
from dsagent.format.bundles.bundle import unpack_bundle
from dsagent.format.bundles.extract import STAGING_DIR, create_empty_directories, frame_decoders, member_writers
from dsagent.format.digester import REMOTE_WORKERS, is_local, mtime_ns
from dsagent.format.durable import WritebackError, syncfs, writeback_for
from dsagent.format.manifest import (
    CHUNK_SIZE,
    BundleRef,
    FileEntry,
    FileHasher,
    Manifest,
    is_safe_path,
)
from dsagent.format.oneversion import open_one_version
from dsagent.format.storage import forget_listings, resolve, translate_errors
from dsagent.format.storageconfig import Options

if TYPE_CHECKING:
    from dsagent.cache.peers import PeerSwarm

_T = TypeVar("_T")
log = logging.getLogger("dsagent.fetch")


@dataclass(frozen=True)
class Source:
    """Where a version comes from. ``storage_options`` may hold credentials: never log it."""

    url: str
    bundles: str | None = None
    storage_options: Options = None


def listing_matches(source: Source, manifest: Manifest) -> bool:
    """Whether a remote source still lists exactly ``manifest``'s files with their sizes and
    modification times: then its digest is ``manifest.digest`` without reading a byte.

    The remote counterpart of the local stat-keyed digest cache. Any doubt (a listing
    without sizes or times, an extra or missing file) answers False, and the caller
    digests the source.
    """
    fs, root = resolve(source.url, source.storage_options)
    if is_local(fs) or not manifest.entries:
        return False
    prefix = root.rstrip("/") + "/"
    with translate_errors(f"source {source.url!r}", fs=fs, path=root):
        forget_listings(fs, root)  # ask the store, not a listing an earlier request left
        listing = fs.find(root, detail=True)
    seen: dict[str, tuple[int, int]] = {}
    for full, info in listing.items():
        if info.get("type") == "directory" or not full.startswith(prefix):
            continue
        size, mtime = info.get("size"), mtime_ns(info)
        if size is None or mtime == 0:
            return False
        seen[full[len(prefix) :]] = (int(size), mtime)
    return seen == {e.path: (e.size, e.mtime_ns) for e in manifest.entries}


def safe_target(root: Path, relative: str) -> Path:
    """``root/relative``, refusing anything that would land outside ``root``."""
    if not is_safe_path(relative):
        raise InvalidInput(f"unsafe path {relative!r} in a manifest")
    return root.joinpath(*relative.split("/"))


def copy_file(fs: Any, source_path: str, dest: Path, entry: FileEntry, progress: FetchProgress) -> None:
    """Copy one file, hashing while copying; the copy is removed unless its digest matches."""
    digest = copy_hashing(fs, source_path, dest, entry.path, entry.mtime_ns, progress, size=entry.size)
    if digest != entry.digest:
        dest.unlink(missing_ok=True)
        raise IntegrityError(
            f"{entry.path!r} changed while it was cached (digest {digest} != {entry.digest})",
            hint="the source changed during the fetch; request the dataset again",
        )


@contextmanager
def _cache_disk(relative: str) -> Iterator[None]:
    """An OSError inside is the cache disk's (it read as the source's)."""
    try:
        yield
    except OSError as exc:
        raise local_write_error(exc, f"copying {relative!r} into the cache") from exc


def _create(dest: Path, relative: str) -> BinaryIO:
    with _cache_disk(relative):
        return open(dest, "wb")


def copy_hashing(
    fs: Any, source_path: str, dest: Path, relative: str, mtime_ns: int, progress: FetchProgress, *, size: int
) -> str:
    """Copy one file to ``dest`` (fsynced, with ``mtime_ns``) and return its xxh3-128;
    ``size``: what the listing or the manifest says it holds (picks how it is read)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    hasher = FileHasher()
    try:
        with (
            translate_errors(f"source file {relative!r}"),
            open_one_version(fs, source_path, size=size) as src,
            _create(dest, relative) as out,
        ):
            while chunk := src.read(CHUNK_SIZE):
                hasher.update(chunk)
                with _cache_disk(relative):  # a failed write is the cache disk's, not the source's
                    out.write(chunk)
                progress.add(len(chunk))
        os.utime(dest, ns=(mtime_ns, mtime_ns))  # durable with the whole tree: see finish()
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    progress.add(0, 1)
    return hasher.hexdigest()


@dataclass(frozen=True)
class Listed:
    """A file a remote listing found: where it is, how big, when modified."""

    path: str  # relative POSIX path
    location: str
    size: int
    mtime_ns: int


def list_remote(source: Source) -> tuple[list[Listed], list[str]] | None:
    """The files and empty directories of a remote source, or None when neither the listing
    nor a per-file ``info`` gives sizes (the caller then digests the source first: sizes
    are needed to reserve space).

    An HTTP directory index lists names without sizes; asking each file's size (a HEAD,
    :data:`REMOTE_WORKERS` at a time) costs far less than the digest pass that used to get
    them, which read every file once more before the copy read it again."""
    fs, root = resolve(source.url, source.storage_options)
    if is_local(fs):
        return None
    prefix = root.rstrip("/") + "/"
    with translate_errors(f"source {source.url!r}", fs=fs, path=root):
        forget_listings(fs, root)  # ask the store, not a listing an earlier request left
        if not fs.isdir(root):
            return None
        listing = fs.find(root, withdirs=True, detail=True)
    files: list[Listed] = []
    dirs: list[str] = []
    unsized: list[tuple[str, str]] = []
    for full, info in listing.items():
        full = full.rstrip("/")
        if not full.startswith(prefix):
            continue
        rel = full[len(prefix) :]
        if info.get("type") == "directory":
            dirs.append(rel)
            continue
        safe_target(Path("/"), rel)  # refuse names that could escape the staging directory
        if info.get("size") is None:
            unsized.append((rel, full))
        else:
            files.append(Listed(rel, full, int(info["size"]), mtime_ns(info)))
    if unsized:
        with translate_errors(f"source {source.url!r}"), ThreadPoolExecutor(REMOTE_WORKERS) as pool:
            infos = list(pool.map(fs.info, [full for _, full in unsized]))
        if any(info.get("size") is None for info in infos):
            return None
        files += [Listed(rel, full, int(info["size"]), mtime_ns(info)) for (rel, full), info in zip(unsized, infos)]
    parents = {f.path.rsplit("/", 1)[0] for f in files if "/" in f.path} | {
        d.rsplit("/", 1)[0] for d in dirs if "/" in d
    }
    return sorted(files, key=lambda f: f.path), sorted(d for d in dirs if d not in parents)


async def copy_and_digest(
    source: Source, files: Sequence[Listed], staging: Path, *, progress: FetchProgress, executor: Executor, workers: int
) -> list[FileEntry]:
    """Per-file copy of a remote source with no manifest yet, building its entries from the
    digests computed while copying (each file is read once)."""
    fs, _ = resolve(source.url, source.storage_options)
    digests: dict[str, str] = {}

    def one(item: Listed) -> None:
        digests[item.path] = copy_hashing(
            fs, item.location, safe_target(staging, item.path), item.path, item.mtime_ns, progress, size=item.size
        )

    await _bounded(executor, workers, [functools.partial(one, f) for f in files])
    entries = [FileEntry(f.path, f.size, f.mtime_ns, digests[f.path]) for f in files]
    for entry, written in zip(entries, files):
        actual = safe_target(staging, entry.path).stat().st_size
        if actual != written.size:
            raise IntegrityError(
                f"{entry.path!r} changed while it was cached ({written.size} -> {actual} bytes)",
                hint="request the dataset again once the source is quiet",
            )
    return entries


async def _bounded(
    executor: Executor,
    workers: int,
    calls: Iterable[Callable[[], _T]],
    after: Callable[[int, _T], Awaitable[None]] | None = None,
) -> None:
    """Run blocking ``calls`` with at most ``workers`` at once; the first error wins.
    ``after(index, result)`` runs on the loop after each call that returned."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(workers)
    failure: list[BaseException] = []

    async def one(index: int, call: Callable[[], _T]) -> None:
        async with gate:
            if failure:
                return
            try:
                result = await loop.run_in_executor(executor, call)
                if after is not None:
                    await after(index, result)
            except BaseException as exc:  # collected, re-raised once below
                failure.append(exc)

    await asyncio.gather(*(one(i, call) for i, call in enumerate(calls)))
    if failure:
        raise failure[0]


async def fetch_files(
    source: Source, manifest: Manifest, staging: Path, *, progress: FetchProgress, executor: Executor, workers: int
) -> None:
    """Per-file copy of every entry of ``manifest`` from ``source.url`` into ``staging``."""
    fs, root = resolve(source.url, source.storage_options)
    base = root.rstrip("/")
    calls = [
        functools.partial(copy_file, fs, f"{base}/{entry.path}", safe_target(staging, entry.path), entry, progress)
        for entry in manifest.entries
    ]
    await _bounded(executor, workers, calls)


def link_bundle(origin: Path, staging: Path, entries: Sequence[FileEntry], progress: FetchProgress) -> None:
    """Hard-link (or copy across filesystems) a bundle's files from another cached version."""
    for entry in entries:
        src, dest = safe_target(origin, entry.path), safe_target(staging, entry.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
        progress.add(entry.size, 1)


def clear_interrupted(staging: Path) -> None:
    """Remove what a crash left of bundles being unpacked into their private staging area
    (a peer's delivery, :mod:`dsagent.cache.peers`). A bundle unpacked in place leaves its
    files at their paths instead: :func:`clear_bundle` removes those."""
    shutil.rmtree(staging / STAGING_DIR, ignore_errors=True)


def clear_bundle(staging: Path, manifest: Manifest, bundle: BundleRef) -> None:
    """Remove whatever of ``bundle``'s files is in ``staging`` (an unrecorded attempt's
    leftovers: written in place, some may be partial), so that it can be unpacked again."""
    prefix = f"{staging}/"
    for entry in manifest.bundle_entries(bundle):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(prefix + entry.path)


def finish(staging: Path, manifest: Manifest, *, writeback_since: int | None = None) -> None:
    """Create the manifest's empty directories and make the whole tree durable (one
    ``syncfs`` instead of an fsync per small file) before it may be published.

    A write error the kernel reports, to this ``syncfs`` or (``writeback_since``: the
    filesystem's :meth:`~dsagent.format.durable.Writeback.mark` taken when the fetch
    started) to a background flush meanwhile, fails the fetch: the copy is not published
    (docs/design.md#ready-invariant)."""
    clear_interrupted(staging)
    create_empty_directories(manifest, staging)
    try:
        syncfs(staging)
        if writeback_since is not None:
            writeback_for(staging).check(writeback_since)
    except WritebackError as exc:
        if is_full_disk(exc):
            raise InsufficientSpace(
                f"the cache disk ran out of space while flushing {staging}: {exc}",
                hint="free space or evict unused datasets",
            ) from exc
        raise IntegrityError(
            f"flushing {staging} to disk failed: {exc}", hint="the cache disk reported a write error (see dmesg)"
        ) from exc


def writeback_mark(staging: Path) -> int:
    """The background writeback's failure mark of the filesystem holding ``staging``."""
    return writeback_for(staging).mark()


async def fetch_bundles(
    source: Source,
    manifest: Manifest,
    staging: Path,
    *,
    done: set[str],
    on_bundle_done: Callable[[BundleRef], Awaitable[None]],
    local: Mapping[str, Path] | None = None,
    progress: FetchProgress,
    executor: Executor,
    workers: int,
    swarm: PeerSwarm | None = None,
    links: LinkSet | None = None,
) -> None:
    """Unpack every bundle not in ``done`` into ``staging``; ``on_bundle_done`` records each.

    ``local`` maps bundle digests to ready directories of other versions that hold the
    same files: those are hard-linked from there instead of downloaded, so a changed
    dataset only fetches the bundles that changed (cached copies are never modified).
    With ``swarm`` each bundle is asked of peers first (docs/design.md#peers): the bundles
    are taken from this agent's own offset on, and those another agent is downloading are
    put off to a second round, which waits for that agent before reading the store.
    With ``links`` each bundle goes over one of the node's links, peers and store alike
    (:mod:`dsagent.cache.fetchlinks`, docs/design.md#links): the workers spread the bundles over
    them, and a link that fails hands its remaining bundles to the others. When the version
    has fewer bundles than links, a large bundle from the store is read as byte ranges, one
    link each (:mod:`dsagent.cache.fetchranges`); a store that answers no ranges, or ranges
    that fail, fall back to one stream.
    """
    assert source.bundles is not None
    todo = [b for b in manifest.bundles if b.digest not in done]
    for bundle in manifest.bundles:
        if bundle.digest in done:
            progress.skip(bundle.size, bundle.count)
    if swarm is not None and todo:
        start = swarm.offset % len(todo)
        todo = todo[start:] + todo[:start]

    clear_interrupted(staging)
    # a resumed fetch may hold an unrecorded bundle's leftovers: each one is cleared first
    try:
        with os.scandir(staging) as listing:
            resumed = next(listing, None) is not None
    except FileNotFoundError:  # the unpack says what is wrong with it
        resumed = False
    later: list[int] = []

    store = source.bundles
    bindable = can_bind(store)
    decoders = frame_decoders(min(workers, len(todo)))  # the cores the bundles at once leave
    writers = member_writers(min(workers, len(todo)))  # and the threads writing each one's files

    def from_store(bundle: BundleRef, lease: Lease) -> None:
        tries = [0]

        def attempt(unpack_one: Callable[[Callable[[int, int], None]], object]) -> None:
            if resumed or tries[0]:
                clear_bundle(staging, manifest, bundle)
            tries[0] += 1
            counted = [0, 0]

            def count(nbytes: int, nfiles: int = 0) -> None:
                counted[0] += nbytes
                counted[1] += nfiles
                progress.add(nbytes, nfiles)

            try:
                unpack_one(count)
            except BaseException:
                progress.add(-counted[0], -counted[1])  # tried again over another link, or the fetch fails
                raise

        def read(address: str | None) -> None:
            attempt(
                lambda count: unpack_bundle(
                    store,
                    manifest,
                    bundle,
                    staging,
                    storage_options=bound_options(store, source.storage_options, address, lease.netns),
                    progress=count,
                    in_place=True,
                    decoders=decoders,
                    writers=writers,
                )
            )

        plan = ranged(bundle, lease)
        if plan and lease.links is not None and lease.address is not None:
            links_, address = lease.links, lease.address
            try:  # one bundle over several links, one byte range each (docs/design.md#links)
                attempt(
                    lambda count: unpack_ranged(
                        store,
                        source.storage_options,
                        manifest,
                        bundle,
                        staging,
                        plan,
                        links_,
                        address,
                        progress=count,
                        writers=writers,
                    )
                )
                return
            except RangesUnsupported as exc:
                log.info("%s: %s; reading it in one stream", links_.what, exc)
            except NOT_LINK_ERRORS:
                raise
            except LINK_ERRORS as exc:
                log.warning("%s: the byte ranges of bundle %s failed (%s); reading it in one stream",
                            links_.what, bundle.digest, exc)  # fmt: skip
        (lease if bindable else DEFAULT_ROUTE).attempt(read, source="store", size=bundle.size)

    def ranged(bundle: BundleRef, lease: Lease) -> tuple[tuple[int, int], ...]:
        """The byte ranges ``bundle`` is read as over the links; () for one stream."""
        if links is None or not bindable or lease.links is None:
            return ()
        return range_plan(bundle.compressed_size, len(manifest.bundles), len(links.addresses), links.range_min)

    def unpack(index: int, second: bool = False) -> bool:
        bundle = todo[index]
        if local and bundle.digest in local:
            link_bundle(local[bundle.digest], staging, manifest.bundle_entries(bundle), progress)
            return True
        with links.lease() if links is not None else contextlib.nullcontext(DEFAULT_ROUTE) as lease:
            if swarm is None:
                from_store(bundle, lease)
                return True
            return swarm.unpack(
                bundle, index, second=second, from_store=functools.partial(from_store, bundle, lease), lease=lease,
                writers=writers,
            )  # fmt: skip

    async def after(index: int, finished: bool) -> None:
        if not finished:
            later.append(index)
            return
        try:
            await on_bundle_done(todo[index])
        finally:
            if swarm is not None:
                swarm.recorded(todo[index])  # served from now on (or, on failure, not claimed any more)

    try:
        await _bounded(executor, workers, [functools.partial(unpack, i) for i in range(len(todo))], after)
        if later:
            assert swarm is not None
            refresh = functools.partial(swarm.session.maybe_refresh, force=True)  # who finished what by now
            await asyncio.get_running_loop().run_in_executor(executor, refresh)
            order = sorted(later)

            async def after_second(position: int, finished: bool) -> None:
                # _bounded numbers the calls it was given: map back to the bundle's index
                # (``todo[position]`` would record the wrong bundles, which the ready check,
                # docs/design.md#ready-invariant, refuses)
                await after(order[position], finished)

            await _bounded(executor, workers, [functools.partial(unpack, i, True) for i in order], after_second)
    finally:
        if swarm is not None:
            swarm.close()


__all__ = [
    "Listed",
    "Source",
    "copy_and_digest",
    "copy_hashing",
    "list_remote",
    "clear_bundle",
    "clear_interrupted",
    "copy_file",
    "finish",
    "writeback_mark",
    "listing_matches",
    "fetch_bundles",
    "fetch_files",
    "safe_target",
]
