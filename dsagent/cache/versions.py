"""Versions: making a dataset version ready, from a consistency check to a ready commit.

Who calls it: :class:`dsagent.cache.service.CacheService`, inside its single-flight steps (one
resolve per request identity, one fetch per version), so nothing here deduplicates work.
What it owns: the consistency check (docs/design.md#rule-2) (:meth:`Versions.resolve`: the packed manifest,
else a listing that matches the cached copy, else a digest, else a per-file copy that
digests while it copies) and the fetch of a resolved version into staging, its atomic
publication and its catalog commit (:meth:`Versions.fetch`); both ways in make a version
ready through one sequence (:meth:`Versions._stage_and_commit`). Space comes from
:mod:`dsagent.cache.space` (reserved before any byte is written); progress goes to
:mod:`dsagent.cache.progress`; the fetch paths themselves are :mod:`dsagent.cache.fetch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dsagent.cache import ready
from dsagent.cache.fetch import (
    Source,
    copy_and_digest,
    fetch_bundles,
    fetch_files,
    finish,
    list_remote,
    listing_matches,
    writeback_mark,
)
from dsagent.cache.fetchlinks import Links, can_bind
from dsagent.cache.fetchranges import spool_bound
from dsagent.cache.layout import Key
from dsagent.cache.metrics import error_code
from dsagent.cache.node import Node
from dsagent.cache.peers import PeerFetcher, PeerSwarm, bundle_options
from dsagent.cache.space import Space
from dsagent.cache.task import redact_url
from dsagent.errors import BundleMissing, DsagentError, InsufficientSpace, IntegrityError, NotFound
from dsagent.format.digestcache import DigestCache
from dsagent.format.digester import build_manifest, is_local
from dsagent.format.manifest import BundleRef, Manifest, read_manifest
from dsagent.format.storage import resolve
from dsplatform.units import format_size

log = logging.getLogger("dsagent")


class Versions:
    """Resolves and fetches versions; shares the node's state and its space with the service."""

    def __init__(
        self, node: Node, *, space: Space, peers: PeerFetcher | None = None, links: Links | None = None
    ) -> None:
        self.peers, self.space = peers, space
        self.links = links  # the node's links bundles spread over (docs/design.md#links)
        self.settings, self.pools, self.store, self.clock = node.settings, node.pools, node.store, node.clock
        self._catalog = node.catalog
        self.metrics, self.claims, self.flights, self.progress = node.metrics, node.claims, node.flights, node.progress
        self._fetch_slots = asyncio.Semaphore(node.settings.max_fetches)
        self._pending: set[str] = set()  # tokens of the per-file copies in progress

    def _file_copies(self) -> dict[str, Any]:
        """How per-file copies run, digesting or not: the fetch workers' threads, this many at once."""
        return {"executor": self.pools.executor, "workers": self.settings.fetch_workers}

    async def stored_manifest(self, name: str, digest: str) -> Manifest | None:
        data = await self.pools.work(self.store.read_manifest_bytes, name, digest)
        if data is None:
            return None
        try:
            return Manifest.from_bytes(data)
        except IntegrityError:
            return None

    # -- the consistency check ----------------------------------------------------------

    async def resolve(self, name: str, source: Source, *, allow_per_file: bool = False) -> tuple[Manifest, bool]:
        """The source's current manifest (docs/design.md#rule-2) and whether resolving it cached it too.

        A bundle store without the dataset is :class:`BundleMissing` unless ``allow_per_file``
        (never a silent fall-back to a slow per-file copy); a store that cannot
        be reached keeps its own error. Then, in order: the packed manifest when the bundle
        store has one; the cached version's
        manifest when a remote listing shows the same files, sizes and times; for a local
        source a digest (through the stat-keyed digest cache); for a remote one a per-file
        copy that digests while it copies (each file read once); else a digest.
        """
        cached = await self._current_manifest(name, source.url)

        def read() -> Manifest | None:
            if source.bundles:
                try:
                    return read_manifest(
                        source.bundles,
                        name,
                        storage_options=source.storage_options,
                        max_files=self.settings.max_dataset_files,
                    )
                except NotFound as exc:
                    store = redact_url(source.bundles)
                    if not allow_per_file:
                        raise BundleMissing(
                            f"no dataset {name!r} in bundle store {store}",
                            hint=f"pack it first: dsctl pack SOURCE --name {name} --to {store}; or fix the store;"
                            " or copy file by file (slow): dsctl cache --allow-per-file (API: allowPerFile)",
                        ) from exc
                    log.info("no packed manifest for %s in %s; copying the source file by file", name, store)
            if cached is not None and listing_matches(source, cached):
                return cached
            if not source.bundles and not _is_local_url(source):
                return None  # digest while copying
            return self._digest(name, source)

        manifest = await self.pools.work(read)
        if manifest is None:
            copied = await self._copy_and_digest(name, source)
            if copied is not None:
                return copied
            manifest = await self.pools.work(self._digest, name, source)
        return manifest, False

    def _digest(self, name: str, source: Source) -> Manifest:
        # local and NFS sources: re-checking an unchanged tree costs a walk and a stat per file
        with DigestCache(self.store.root / "digests.db") as cache:
            return build_manifest(
                source.url,
                name=name,
                storage_options=source.storage_options,
                workers=self.settings.fetch_workers,
                digest_cache=cache,
                confine=self.settings.local_sources,
            )

    async def _current_manifest(self, name: str, url: str) -> Manifest | None:
        rows = [
            r for r in await self.pools.db(self._catalog().versions, name) if r.state == "ready" and r.source == url
        ]
        return await self.stored_manifest(name, rows[-1].digest) if rows else None

    async def _copy_and_digest(self, name: str, source: Source) -> tuple[Manifest, bool] | None:
        """Cache a remote source that has no manifest by copying it once, hashing as it goes;
        None when its listing lacks sizes (then it is digested first)."""
        listed = await self.pools.work(list_remote, source)
        if listed is None:
            return None
        files, dirs = listed
        total = sum(f.size for f in files)
        token = uuid.uuid4().hex[:16]
        key = (name, f"pending-{token}")
        self.metrics.miss()
        async with self._fetch_slots:
            await self.space.reserve(key, total, overhead=self.store.allocated(total, len(files) + len(dirs)) - total)
            self._pending.add(token)
            staging = self.store.pending_dir(name, token)
            progress = self.progress.start_pending(key, source.url, total, len(files))
            started = time.monotonic()
            try:
                await self.pools.work(self.store.discard_orphan_pending, name, frozenset(self._pending))
                await self.pools.work(lambda: staging.mkdir(parents=True))
                since = await self.pools.work(writeback_mark, staging)
                entries = await copy_and_digest(source, files, staging, progress=progress, **self._file_copies())
                manifest = Manifest.create(name, entries, directories=dirs)
                await self.pools.work(functools.partial(finish, staging, manifest, writeback_since=since))
                adopted = await self._adopt(key, manifest, source)
            except BaseException as exc:
                self.metrics.fetch_failed(error_code(exc))
                await self.pools.work(self.store.discard_pending, name, token)
                raise
            finally:
                self._pending.discard(token)
                self.space.release(key)
                self.progress.end(key, source.url)
        self.metrics.fetch_succeeded(time.monotonic() - started, manifest.total_bytes)
        self.metrics.bytes_fetched(progress.bytes_done)
        if adopted:
            log.info(
                "cached %s@%s: %d files, %s",
                name,
                manifest.digest[:12],
                manifest.file_count,
                format_size(manifest.total_bytes),
            )
            await self.space.collect_superseded(name)
        return manifest, adopted

    async def _adopt(self, pending: Key, manifest: Manifest, source: Source) -> bool:
        """Make a finished pending copy its version, unless that version exists already.

        Under the space lock, so no eviction is half done on this version meanwhile; the
        waiting tasks claim it before it becomes ready, and its reservation moves to its
        own key so that space is counted once until the commit."""
        key, token = (manifest.name, manifest.digest), pending[1].removeprefix("pending-")
        async with self.space.lock:
            self.claims.settle((manifest.name, source.url, source.bundles), manifest.digest)
            row = await self.pools.db(self._catalog().version, *key)
            if (row is not None and row.state == "ready") or self.flights.is_fetching(key):
                await self.pools.work(self.store.discard_pending, manifest.name, token)
                return False  # the caller takes the existing version (a hit) or joins its fetch
            self.space.move(pending, key, manifest.total_bytes)
            self.progress.rename(pending, key)
            try:
                await self._stage_and_commit(
                    manifest,
                    source,
                    bundles=None,
                    stage=lambda: self.pools.work(self.store.adopt, manifest.name, token, manifest.digest),
                )
            finally:
                self.space.release(key)
                self.progress.end(key)
        return True

    # -- fetching a resolved version ----------------------------------------------------

    async def fetch(self, source: Source, manifest: Manifest) -> None:
        """Make ``manifest``'s version ready, unless it already is (a hit)."""
        key = (manifest.name, manifest.digest)
        row = await self.pools.db(self._catalog().version, *key)
        if row is not None and row.state == "ready" and not await self.pools.work(self.store.ready_dir(*key).is_dir):
            log.warning("dataset %s@%s vanished from disk; fetching it again", *key)
            await self.pools.db(self._catalog().delete_version, *key)
            row = None
        if row is not None and row.state == "ready":
            self.metrics.hit()
            await self.pools.db(self._catalog().touch, *key, self.clock())
            return
        self.metrics.miss()
        async with self._fetch_slots:
            staged = await self.pools.work(self.store.staged_bytes, *key)  # a resumed fetch's own bytes count once
            size = manifest.total_bytes
            overhead = self.store.allocated(size, manifest.file_count + len(manifest.directories)) - size
            staged = min(staged, size + overhead)
            overhead += self._spool_bound(source, manifest)  # byte ranges spooled while a bundle unpacks
            await self.space.reserve(key, size, overhead=overhead, staged=staged)
            started = time.monotonic()
            try:
                await self._fetch_reserved(source, manifest)
            except BaseException as exc:
                self.metrics.fetch_failed(error_code(exc))
                message = exc.message if isinstance(exc, DsagentError) else f"{type(exc).__name__}: {exc}"
                if isinstance(exc, (IntegrityError, InsufficientSpace)):
                    # never resume from data that failed a check; a full disk gets its space back
                    await self._abandon(key, message)
                else:  # the staging stays, resumable, and its bundle records with it
                    with contextlib.suppress(Exception):
                        await self.pools.db(self._catalog().mark_failed, *key, message)
                raise
            finally:
                self.space.release(key)
                self.progress.end(key)
        self.metrics.fetch_succeeded(time.monotonic() - started, manifest.total_bytes)
        log.info(
            "cached %s@%s: %d files, %s",
            manifest.name,
            manifest.digest[:12],
            manifest.file_count,
            format_size(manifest.total_bytes),
        )
        await self.space.collect_superseded(manifest.name)

    async def _abandon(self, key: Key, message: str) -> None:
        """Record a failed fetch and remove its staging (docs/design.md#ready-invariant).

        Its "bundle done" records end in the transaction that records the failure, and the
        directory goes only once that committed: a stop in between leaves a staging with no
        records (its bundles are fetched again), never records without their files. A full
        disk refuses the first write; the catalog's reserve then makes room for the second.
        When neither commits, the staging stays with its records (they still agree)."""
        for attempt in range(2):
            try:
                await self.pools.db(self._catalog().abandon, *key, message)
                break
            except DsagentError as exc:
                if attempt or not isinstance(exc, InsufficientSpace):
                    log.warning("cannot record the failed fetch of %s@%s (%s); keeping its staging", *key, exc)
                    return
        await self.pools.work(self.store.discard_staging, *key)

    async def _fetch_reserved(self, source: Source, manifest: Manifest) -> None:
        key = (manifest.name, manifest.digest)

        async def stage() -> None:
            staging = self.store.staging_dir(*key)
            await self.pools.work(lambda: staging.mkdir(parents=True, exist_ok=True))
            since = await self.pools.work(writeback_mark, staging)  # a flush failing from here fails the fetch
            progress = self.progress.start(key, manifest.total_bytes, manifest.file_count)
            if manifest.bundles and source.bundles:
                await self._fetch_bundles(source, manifest, staging)
            else:
                await fetch_files(source, manifest, staging, progress=progress, **self._file_copies())
            await self.pools.work(functools.partial(finish, staging, manifest, writeback_since=since))
            self.metrics.bytes_fetched(progress.bytes_done)

        await self._stage_and_commit(
            manifest, source, bundles=source.bundles if manifest.bundles else None, stage=stage
        )

    async def _stage_and_commit(
        self, manifest: Manifest, source: Source, *, bundles: str | None, stage: Callable[[], Awaitable[object]]
    ) -> None:
        """Mark a version ready, the one sequence both ways in (a fetch, an adopted per-file copy) use.

        In this order, which recovery (:mod:`dsagent.cache.recovery`) relies on: the catalog
        records the version as fetching (so its staging is owned, kept and resumable), its
        manifest is written, ``stage`` puts the data in its staging directory (fetches it,
        or renames a finished copy there), the staging directory is renamed into place,
        and only then is the version committed ready (so a ready row always has its
        directory; a lost commit is redone from the directory), the last two steps through
        :func:`dsagent.cache.ready.make_ready`, the one place a version becomes ready
        (docs/design.md#ready-invariant). The caller holds the
        version's reservation and handles errors; nothing here catches one."""
        key = (manifest.name, manifest.digest)
        await self.pools.db(
            self._catalog().begin_version,
            *key,
            size_bytes=manifest.total_bytes,
            files=manifest.file_count,
            source=source.url,
            bundles=bundles,
            now=self.clock(),
        )
        await self.pools.work(self.store.write_manifest, *key, manifest.to_bytes())
        await stage()
        await ready.make_ready(
            self.pools, self._catalog(), self.store, manifest, bundles=bundles is not None, now=self.clock()
        )

    async def _fetch_bundles(self, source: Source, manifest: Manifest, staging: Path) -> None:
        key = (manifest.name, manifest.digest)
        recorded = await self.pools.db(self._catalog().bundles_done, *key)
        done = await self.pools.work(ready.trusted_bundles, staging, manifest, recorded)
        if recorded - done:  # records whose files are gone: never skip those bundles
            log.warning("%s@%s: %d bundle records without their files; fetching them again", *key, len(recorded - done))
            await self.pools.db(self._catalog().forget_bundles, *key, sorted(recorded - done))

        async def record(bundle: BundleRef) -> None:
            await self.pools.db(self._catalog().bundle_done, *key, bundle.digest)

        async with self.space.lock:  # no eviction is half done on a version we link from
            local = await self._local_bundles(manifest)
            origins = Counter((path.parent.name, path.name) for path in set(local.values()))
            self.space.pin(origins)
        progress = self.progress.get(key)
        assert progress is not None
        assert source.bundles is not None
        swarm = None
        session = (
            await self.peers.session(*key) if self.peers is not None and len(local) < len(manifest.bundles) else None
        )
        if session is not None and self.peers is not None:
            swarm = PeerSwarm(self.peers, session, manifest, staging, progress)
            log.info(
                "fetching %s@%s from peers first (holders now: %s)",
                manifest.name,
                manifest.digest[:12],
                ", ".join(session.holders) or "none",
            )

        options = bundle_options(self.settings, source.bundles, source.storage_options)
        links = self.links.for_fetch(f"{manifest.name}@{manifest.digest[:12]}") if self.links is not None else None
        try:
            await fetch_bundles(
                Source(source.url, source.bundles, options),
                manifest,
                staging,
                done=done,
                on_bundle_done=record,
                local=local,
                progress=progress,
                executor=self.pools.executor,
                workers=self.settings.fetch_workers,
                swarm=swarm,
                links=links,
            )
        finally:
            self.space.unpin(origins)
        if links is not None:
            log.info(
                "fetched %s@%s over links %s",
                manifest.name,
                manifest.digest[:12],
                ", ".join(
                    f"{a} ({links.bundles[a]} bundles{f', {links.ranges[a]} ranges' if links.ranges[a] else ''})"
                    for a in links.addresses
                ),
            )

    def _spool_bound(self, source: Source, manifest: Manifest) -> int:
        """The disk a fetch of ``manifest`` over the links may spool (docs/design.md#links)."""
        if self.links is None or not self.links or not source.bundles or not can_bind(source.bundles):
            return 0
        return spool_bound(manifest, len(self.links.addresses), self.links.range_min)

    async def _local_bundles(self, manifest: Manifest) -> dict[str, Path]:
        """Bundles of ``manifest`` that another ready version of the dataset already holds."""
        wanted = {b.digest for b in manifest.bundles}
        found: dict[str, Path] = {}
        for row in await self.pools.db(self._catalog().versions, manifest.name):
            if row.state != "ready" or row.digest == manifest.digest:
                continue
            other = await self.stored_manifest(row.name, row.digest)
            for bundle in other.bundles if other else ():
                if bundle.digest in wanted:
                    found.setdefault(bundle.digest, self.store.ready_dir(row.name, row.digest))
        return found


def _is_local_url(source: Source) -> bool:
    return is_local(resolve(source.url, source.storage_options)[0])


__all__ = ["Versions"]
