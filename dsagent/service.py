"""The agent's one coordinator: tasks, leases, consistency checks, single-flight fetches,
space reservations, eviction, progress and the idle sweep.

Who calls it: the HTTP API (:mod:`dsagent.api`) and, in cluster mode, the Kubernetes
integration (``dsagent.kube.agent.ClusterAgent``); nothing else calls the layers below
(catalog, store, fetch, eviction), so every rule of the paper's section 1 lives here:

1. One request per task: :meth:`CacheService.submit_task` is idempotent per task id;
   repeating it renews the lease and starts no new work.
2. Consistency: each new request for a dataset resolves the source's current digest (the
   packed manifest in the bundle store, one small read; otherwise a digest of the source)
   and a cached copy is a hit only when it is ready with that digest. A changed source
   gets a new version beside the old; the old one goes once no task holds it.
4. Space: a fetch reserves its size first; below ``evict_ratio x size`` free, datasets
   that are neither in use nor fetching are evicted least recently used first
   (:mod:`dsagent.eviction`), else the request fails with the numbers.
6. Concurrency: ``max_fetches`` datasets at once, ``fetch_workers`` threads each;
   concurrent requests for one dataset version share one fetch (single-flight).

Everything runs on one event loop; blocking work goes to a worker pool and the catalog
to its own single thread. After a crash :meth:`start` reconciles catalog and disk and
resumes interrupted fetches (bundles verified before the crash are not fetched again).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from dsagent import eviction
from dsagent.catalog import Catalog, TaskRow, VersionRow
from dsagent.digestcache import DigestCache
from dsagent.errors import Conflict, DsagentError, InsufficientSpace, IntegrityError, InvalidInput, NotFound
from dsagent.fetch import Progress, Source, copy_and_digest, fetch_bundles, fetch_files, finish, list_remote, listing_matches
from dsagent.manifest import BundleRef, Manifest, build_manifest, read_manifest
from dsagent.metrics import Metrics, Sample
from dsagent.settings import Settings
from dsagent.sizes import format_size
from dsagent.storage import resolve
from dsagent.store import Store, validate_name

log = logging.getLogger("dsagent")
_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")
_T = TypeVar("_T")
Key = tuple[str, str]  # (dataset name, version digest)


@dataclass(frozen=True)
class DatasetRequest:
    """One dataset a task asks for. ``storage_options`` is never logged, stored or returned."""

    name: str
    source: str
    bundles: str | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def identity(self) -> tuple[str, str, str | None]:
        return (self.name, self.source, self.bundles)

    def redacted(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "bundles": self.bundles, "hasStorageOptions": bool(self.storage_options)}


@dataclass(frozen=True)
class DatasetStatus:
    """Where one dataset of a task stands."""

    name: str
    source: str
    bundles: str | None
    digest: str | None
    state: str  # resolving | fetching | ready | failed
    path: str | None = None
    size_bytes: int = 0
    files: int = 0
    bytes_done: int = 0
    files_done: int = 0
    rate: float = 0.0
    eta: float | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class TaskRecord:
    task_id: str
    created_at: float
    lease_until: float
    datasets: tuple[DatasetStatus, ...]

    @property
    def state(self) -> str:
        states = {d.state for d in self.datasets}
        if "failed" in states:
            return "failed"
        return "ready" if states <= {"ready"} else "pending"


@dataclass(frozen=True)
class EvictionResult:
    evicted: tuple[eviction.Candidate, ...]
    dry_run: bool
    freed_bytes: int


def redact_url(url: str | None) -> str | None:
    """``url`` without any password in its user-info part (safe for logs and answers)."""
    if not url or "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CacheService:
    """The coordinator; create it, ``await start()``, use it, ``await stop()``."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = Metrics()
        self.store = Store(settings.root)
        self._db_pool = ThreadPoolExecutor(1, thread_name_prefix="dsagent-catalog")
        self._pool = ThreadPoolExecutor(settings.max_fetches * settings.fetch_workers + 2, thread_name_prefix="dsagent-fetch")
        self._catalog: Catalog | None = None
        self._fetch_slots = asyncio.Semaphore(settings.max_fetches)
        self._space_lock = asyncio.Lock()
        self._submit_lock = asyncio.Lock()
        self._flights: dict[tuple[Any, ...], asyncio.Task[Any]] = {}
        self._waiters: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._errors: dict[tuple[str, str], DsagentError] = {}
        self._options: dict[tuple[str, str], Mapping[str, Any] | None] = {}
        self._reservations: dict[Key, int] = {}
        self._progress: dict[Key, Progress] = {}
        self._pending: dict[tuple[str, str], Progress] = {}  # (name, source) -> copy with digest unknown
        # (task, name) -> (request identity, digest once resolved): what a task asked for
        # and is not yet bound to in the catalog; protects a version from eviction in that
        # window (e.g. between a per-file copy becoming ready and the task's bind).
        self._claims: dict[tuple[str, str], tuple[tuple[str, str, str | None], str | None]] = {}
        self._pins: Counter[Key] = Counter()  # versions a fetch hard-links bundles from
        self._sweeper: asyncio.Task[None] | None = None
        self.started = False
        # Set by the cluster integration: checks a new task id (e.g. that it is a pod on
        # this node) and raises a DsagentError to refuse it.
        self.admit_task: Callable[[str], Awaitable[None]] | None = None

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._catalog = await self._db(Catalog, self.store.catalog_path)
        await self._reconcile()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="dsagent-sweep")
        await self._resume_interrupted()
        self.started = True

    async def stop(self) -> None:
        self.started = False
        tasks = [t for t in (self._sweeper, *self._waiters.values(), *self._flights.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._catalog is not None:
            await self._db(self._catalog.close)
        self._db_pool.shutdown(wait=True)

    async def _db(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._db_pool, functools.partial(fn, *args, **kwargs))

    async def _work(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            raise RuntimeError("CacheService.start() was not awaited")
        return self._catalog

    async def _reconcile(self) -> None:
        """Make catalog and disk agree after any stop, clean or kill -9."""
        ready_on_disk, staged_on_disk = await self._work(self.store.on_disk)
        rows = await self._db(self.catalog.versions)
        known = {(r.name, r.digest): r for r in rows}
        for key in ready_on_disk - {k for k, r in known.items() if r.state == "ready"}:
            if key in known:  # renamed into place but the catalog commit was lost
                await self._db(self.catalog.mark_ready, *key, now=self.clock())
            else:
                log.info("removing orphan dataset directory %s/%s", *key)
                await self._work(self.store.remove, *key)
        for key in staged_on_disk - {k for k, r in known.items() if r.state != "ready"}:
            log.info("removing orphan staging directory %s@%s", *key)
            await self._work(self.store.discard_staging, *key)
        for key, row in known.items():
            if row.state == "ready" and key not in ready_on_disk:
                log.warning("dataset %s@%s is gone from disk; forgetting it", *key)
                await self._db(self.catalog.delete_version, *key)
                await self._work(self.store.remove, *key)
        await self._work(self.store.empty_trash)
        await self._work(self.store.prune_empty_names)

    async def _resume_interrupted(self) -> None:
        """Restart the work a stop interrupted, for live tasks that need no credentials
        (the others resume when their init-container repeats the request)."""
        now = self.clock()
        for task in await self._db(self.catalog.tasks):
            if task.lease_until <= now:
                continue
            for item in task.request:
                digest = task.digests.get(item["name"])
                row = await self._db(self.catalog.version, item["name"], digest) if digest else None
                if (row is None or row.state != "ready") and not item.get("hasStorageOptions"):
                    request = DatasetRequest(item["name"], item["source"], item.get("bundles"))
                    self._start_waiter(task.task_id, request, digest)

    # -- tasks ------------------------------------------------------------------------

    async def submit_task(self, task_id: str, datasets: Sequence[DatasetRequest], *, wait: float | None = None) -> TaskRecord:
        """Ask for a task's datasets (idempotent); with ``wait``, wait up to that many seconds."""
        requests = await self._validate(task_id, datasets)
        now = self.clock()
        lease_until = now + self.settings.lease_ttl
        if self.admit_task is not None and await self._db(self.catalog.task, task_id) is None:
            # Admission may wait (e.g. for the pod watch to see the pod): do it before the
            # lock so it never holds up other tasks' requests.
            await self.admit_task(task_id)
        async with self._submit_lock:  # the same task id sent twice at once is still one task
            existing = await self._db(self.catalog.task, task_id)
            if existing is None:
                await self._db(self.catalog.create_task, task_id, [r.redacted() for r in requests], now=now, lease_until=lease_until)
                existing = await self._db(self.catalog.task, task_id)
                assert existing is not None
            else:
                _check_same_request(existing, requests)
                await self._db(self.catalog.renew_task, task_id, lease_until)
                await self._db(self.catalog.touch_task, task_id, now)
            for request in requests:
                self._options[(task_id, request.name)] = request.storage_options
                await self._ensure(task_id, request, existing.digests.get(request.name))
        if wait:
            await self._wait_for(task_id, wait)
        return await self.get_task(task_id)

    async def _validate(self, task_id: str, datasets: Sequence[DatasetRequest]) -> list[DatasetRequest]:
        if not isinstance(task_id, str) or not _TASK_ID.match(task_id):
            raise InvalidInput(f"invalid task id {task_id!r}", hint="use 1-253 letters, digits, '.', '_', ':' or '-', e.g. a pod UID")
        if not datasets:
            raise InvalidInput("a task must ask for at least one dataset")
        names = [validate_name(d.name) for d in datasets]
        if len(set(names)) != len(names):
            raise InvalidInput(f"dataset names repeat in one task: {sorted(names)}")
        for request in datasets:
            for url in (request.source, request.bundles):
                if url is not None:
                    await self._work(self._check_location, url, request.storage_options)
        return list(datasets)

    def _check_location(self, url: str, storage_options: Mapping[str, Any] | None) -> None:
        fs, path = resolve(url, storage_options)
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        if not {"file", "local"} & set(protocols):
            return
        real = Path(os.path.realpath(path))
        allowed = self.settings.local_sources
        if not any(real.is_relative_to(Path(os.path.realpath(root))) for root in allowed):
            raise InvalidInput(
                f"local source {url!r} is outside the directories this agent may read",
                hint="use a remote URL, or add its directory to DSAGENT_LOCAL_SOURCES on the agent",
            )

    async def _ensure(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        """Start the work a task's dataset still needs, unless it is running or done."""
        waiter = self._waiters.get((task_id, request.name))
        if waiter is not None and not waiter.done():
            return
        if bound is not None:
            row = await self._db(self.catalog.version, request.name, bound)
            if row is not None and row.state == "ready":
                return  # rule 1: a repeated request starts no new work
        self._errors.pop((task_id, request.name), None)
        self._start_waiter(task_id, request, bound)

    def _start_waiter(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        self._claims[(task_id, request.name)] = (request.identity, None)  # protected from now on
        task = asyncio.create_task(self._serve(task_id, request, bound), name=f"dsagent-task-{task_id}-{request.name}")
        self._waiters[(task_id, request.name)] = task

    async def _serve(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        """Resolve, bind and fetch one dataset of one task; errors are kept for the record."""
        source = Source(request.source, request.bundles, self._options.get((task_id, request.name)))
        try:
            stored = None
            if bound is not None and await self._db(self.catalog.version, request.name, bound) is not None:
                stored = await self._stored_manifest(request.name, bound)
            resolved: tuple[Manifest, bool]
            if stored is None:
                flight = ("resolve", *request.identity)
                resolved = await self._single(flight, functools.partial(self._resolve_settling, request, source))
                await self._bind(task_id, request, resolved[0].digest)
            else:
                resolved = (stored, False)
                self._claims.pop((task_id, request.name), None)  # the catalog binding protects it
            manifest, fetched = resolved
            if not fetched:  # a per-file copy that digested while copying is ready already
                await self._single(("fetch", manifest.name, manifest.digest), functools.partial(self._fetch, source, manifest))
        except asyncio.CancelledError:
            raise
        except DsagentError as exc:
            self._errors[(task_id, request.name)] = exc
        except Exception as exc:  # a bug or a foreign error: keep it visible, never crash the loop
            log.exception("caching %s for task %s failed", request.name, task_id)
            self._errors[(task_id, request.name)] = DsagentError(f"internal error: {type(exc).__name__}: {exc}")

    async def _resolve_settling(self, request: DatasetRequest, source: Source) -> tuple[Manifest, bool]:
        resolved = await self._resolve(request.name, source)
        self._settle(request.identity, resolved[0].digest)  # every task waiting on this flight
        return resolved

    def _settle(self, identity: tuple[str, str, str | None], digest: str) -> None:
        """The tasks resolving ``identity`` now claim version ``digest`` (before it can be ready)."""
        for key, (claimed, known) in self._claims.items():
            if claimed == identity and known is None:
                self._claims[key] = (identity, digest)

    async def _bind(self, task_id: str, request: DatasetRequest, digest: str) -> None:
        self._claims[(task_id, request.name)] = (request.identity, digest)
        await self._db(self.catalog.bind, task_id, request.name, digest)
        self._claims.pop((task_id, request.name), None)  # from here the catalog protects it

    def _protected(self, key: Key) -> bool:
        """Claimed by a task not yet bound, being fetched, or a fetch's link origin: checked
        again right before each deletion, since a plan was made on an earlier view."""
        claimed = any((name, digest) == key for (_, name), (_, digest) in self._claims.items())
        return claimed or self._pins[key] > 0 or ("fetch", *key) in self._flights

    async def _single(self, key: tuple[Any, ...], start: Callable[[], Awaitable[_T]]) -> _T:
        """Single-flight: callers with the same key share one running coroutine."""
        flight = self._flights.get(key)
        if flight is None or flight.done():  # a landed flight settled its waiters already
            flight = asyncio.ensure_future(start())
            self._flights[key] = flight
            flight.add_done_callback(functools.partial(self._landed, key))
        return await asyncio.shield(flight)  # one waiter giving up never cancels the flight

    def _landed(self, key: tuple[Any, ...], flight: asyncio.Future[Any]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved here: every waiter sees it; asyncio must not warn

    async def _wait_for(self, task_id: str, timeout: float) -> None:
        waiters = [t for (tid, _), t in self._waiters.items() if tid == task_id and not t.done()]
        if waiters:
            await asyncio.wait(waiters, timeout=timeout)

    async def get_task(self, task_id: str) -> TaskRecord:
        task = await self._db(self.catalog.task, task_id)
        if task is None:
            raise NotFound(f"no task {task_id!r} on this agent", hint="submit it with PUT /v1/tasks/{task} or dsctl cache")
        statuses = [await self._dataset_status(task, item) for item in task.request]
        return TaskRecord(task.task_id, task.created_at, task.lease_until, tuple(statuses))

    async def _dataset_status(self, task: TaskRow, item: dict[str, Any]) -> DatasetStatus:
        name = item["name"]
        digest = task.digests.get(name)
        base = {"name": name, "source": redact_url(item["source"]) or "", "bundles": redact_url(item.get("bundles")), "digest": digest}
        error = self._errors.get((task.task_id, name))
        if error is not None:
            return DatasetStatus(**base, state="failed", error=error.to_dict())
        row = await self._db(self.catalog.version, name, digest) if digest else None
        if row is None:
            waiter = self._waiters.get((task.task_id, name))
            pending = self._pending.get((name, item["source"]))
            if pending is not None and waiter is not None and not waiter.done():
                return DatasetStatus(
                    **base, state="fetching", size_bytes=pending.total_bytes, files=pending.total_files,
                    bytes_done=pending.bytes_done, files_done=pending.files_done, rate=pending.rate(), eta=pending.eta(),
                )
            if waiter is None or waiter.done():  # evicted by force, or gone from disk
                gone = {"code": "gone", "message": "no cached copy and no fetch running (evicted by force, removed, or interrupted by an agent restart)", "hint": "repeat the request to cache it again"}
                return DatasetStatus(**base, state="failed", error=gone)
            return DatasetStatus(**base, state="fetching" if digest else "resolving")
        progress = self._progress.get((name, row.digest))
        if row.state == "ready":
            path = str(self.store.ready_dir(name, row.digest))
            return DatasetStatus(**base, state="ready", path=path, size_bytes=row.size_bytes, files=row.files, bytes_done=row.size_bytes, files_done=row.files)
        waiter = self._waiters.get((task.task_id, name))
        working = (waiter is not None and not waiter.done()) or ("fetch", name, row.digest) in self._flights
        state = "fetching" if working else "failed"
        done = (progress.bytes_done, progress.files_done, progress.rate(), progress.eta()) if progress else (0, 0, 0.0, None)
        message = row.error or "the fetch was interrupted (agent restart)"
        err = {"code": "fetch_failed", "message": message, "hint": "repeat the request to resume it"} if state == "failed" else None
        return DatasetStatus(**base, state=state, size_bytes=row.size_bytes, files=row.files, bytes_done=done[0], files_done=done[1], rate=done[2], eta=done[3], error=err)

    async def task_ids(self) -> list[str]:
        """The ids of every task this agent holds, oldest first (released ones are gone)."""
        return [task.task_id for task in await self._db(self.catalog.tasks)]

    async def release_task(self, task_id: str) -> None:
        """The task no longer needs its datasets (the pod ended); they become evictable."""
        for (tid, name), waiter in list(self._waiters.items()):
            if tid == task_id:
                waiter.cancel()
                self._waiters.pop((tid, name), None)
                self._errors.pop((tid, name), None)
                self._options.pop((tid, name), None)
                self._claims.pop((tid, name), None)
        await self._db(self.catalog.touch_task, task_id, self.clock())  # idle time counts from here
        if not await self._db(self.catalog.delete_task, task_id):
            raise NotFound(f"no task {task_id!r} on this agent")
        await self._collect_superseded()

    # -- resolving and fetching -------------------------------------------------------

    async def _stored_manifest(self, name: str, digest: str) -> Manifest | None:
        data = await self._work(self.store.read_manifest_bytes, name, digest)
        if data is None:
            return None
        try:
            return Manifest.from_bytes(data)
        except IntegrityError:
            return None

    async def _resolve(self, name: str, source: Source) -> tuple[Manifest, bool]:
        """The source's current manifest (rule 2) and whether resolving it cached it too.

        In order: the packed manifest when the bundle store has one; the cached version's
        manifest when a remote listing shows the same files, sizes and times; for a local
        source a digest (through the stat-keyed digest cache); for a remote one a per-file
        copy that digests while it copies (each file read once); else a digest.
        """
        cached = await self._current_manifest(name, source.url)

        def read() -> Manifest | None:
            if source.bundles:
                try:
                    return read_manifest(source.bundles, name, storage_options=source.storage_options)
                except NotFound:
                    log.info("no packed manifest for %s in %s; digesting the source", name, redact_url(source.bundles))
            if cached is not None and listing_matches(source, cached):
                return cached
            if not source.bundles and not _is_local_url(source):
                return None  # digest while copying
            return self._digest(name, source)

        manifest = await self._work(read)
        if manifest is None:
            copied = await self._copy_and_digest(name, source)
            if copied is not None:
                return copied
            manifest = await self._work(self._digest, name, source)
        return manifest, False

    def _digest(self, name: str, source: Source) -> Manifest:
        # local and NFS sources: re-checking an unchanged tree costs a walk and a stat per file
        with DigestCache(self.store.root / "digests.db") as cache:
            return build_manifest(source.url, name=name, storage_options=source.storage_options, workers=self.settings.fetch_workers, digest_cache=cache)

    async def _copy_and_digest(self, name: str, source: Source) -> tuple[Manifest, bool] | None:
        """Cache a remote source that has no manifest by copying it once, hashing as it goes;
        None when its listing lacks sizes (then it is digested first)."""
        listed = await self._work(list_remote, source)
        if listed is None:
            return None
        files, dirs = listed
        total = sum(f.size for f in files)
        token = uuid.uuid4().hex[:16]
        key = (name, f"pending-{token}")
        self.metrics.inc("dsagent_cache_misses_total")
        async with self._fetch_slots:
            await self._reserve(key, total)
            staging = self.store.pending_dir(name, token)
            progress = self._progress[key] = self._pending[(name, source.url)] = Progress(total, len(files))
            started = time.monotonic()
            try:
                await self._work(lambda: staging.mkdir(parents=True))
                entries = await copy_and_digest(source, files, staging, progress=progress, executor=self._pool, workers=self.settings.fetch_workers)
                manifest = Manifest.create(name, entries, directories=dirs)
                await self._work(finish, staging, manifest)
                adopted = await self._adopt(key, manifest, source)
            except BaseException:
                self.metrics.inc("dsagent_fetches_total", result="failed")
                await self._work(self.store.discard_pending, name, token)
                raise
            finally:
                self._reservations.pop(key, None)
                self._progress.pop(key, None)
                self._pending.pop((name, source.url), None)
        self.metrics.inc("dsagent_fetches_total", result="ok")
        self.metrics.inc("dsagent_fetch_seconds_total", time.monotonic() - started)
        self.metrics.inc("dsagent_fetched_bytes_total", progress.bytes_done)
        if adopted:
            log.info("cached %s@%s: %d files, %s", name, manifest.digest[:12], manifest.file_count, format_size(manifest.total_bytes))
            await self._collect_superseded(name)
        return manifest, adopted

    async def _adopt(self, pending: Key, manifest: Manifest, source: Source) -> bool:
        """Make a finished pending copy its version, unless that version exists already.

        Under the space lock, so no eviction is half done on this version meanwhile; the
        waiting tasks claim it before it becomes ready, and its reservation moves to its
        own key so that space is counted once until the commit."""
        key, token = (manifest.name, manifest.digest), pending[1].removeprefix("pending-")
        async with self._space_lock:
            self._settle((manifest.name, source.url, source.bundles), manifest.digest)
            row = await self._db(self.catalog.version, *key)
            if (row is not None and row.state == "ready") or ("fetch", *key) in self._flights:
                await self._work(self.store.discard_pending, manifest.name, token)
                return False  # the caller takes the existing version (a hit) or joins its fetch
            self._reservations[key] = self._reservations.pop(pending, manifest.total_bytes)
            if pending in self._progress:
                self._progress[key] = self._progress.pop(pending)
            try:
                await self._db(
                    self.catalog.begin_version, *key, size_bytes=manifest.total_bytes, files=manifest.file_count,
                    source=source.url, bundles=None, now=self.clock(),
                )
                await self._work(self.store.write_manifest, *key, manifest.to_bytes())
                await self._work(self.store.adopt, manifest.name, token, manifest.digest)
                await self._work(self.store.publish, *key)
                await self._db(self.catalog.mark_ready, *key, now=self.clock())
            finally:
                self._reservations.pop(key, None)
                self._progress.pop(key, None)
        return True

    async def _current_manifest(self, name: str, url: str) -> Manifest | None:
        rows = [r for r in await self._db(self.catalog.versions, name) if r.state == "ready" and r.source == url]
        return await self._stored_manifest(name, rows[-1].digest) if rows else None

    async def _fetch(self, source: Source, manifest: Manifest) -> None:
        """Make ``manifest``'s version ready, unless it already is (a hit)."""
        key = (manifest.name, manifest.digest)
        row = await self._db(self.catalog.version, *key)
        if row is not None and row.state == "ready" and not await self._work(self.store.ready_dir(*key).is_dir):
            log.warning("dataset %s@%s vanished from disk; fetching it again", *key)
            await self._db(self.catalog.delete_version, *key)
            row = None
        if row is not None and row.state == "ready":
            self.metrics.inc("dsagent_cache_hits_total")
            await self._db(self.catalog.touch, *key, self.clock())
            return
        self.metrics.inc("dsagent_cache_misses_total")
        async with self._fetch_slots:
            await self._reserve(key, manifest.total_bytes)
            started = time.monotonic()
            try:
                await self._fetch_reserved(source, manifest)
            except BaseException as exc:
                self.metrics.inc("dsagent_fetches_total", result="failed")
                message = exc.message if isinstance(exc, DsagentError) else f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    await self._db(self.catalog.mark_failed, *key, message)
                if isinstance(exc, IntegrityError):  # never resume from data that failed a check
                    await self._work(self.store.discard_staging, *key)
                raise
            finally:
                self._reservations.pop(key, None)
                self._progress.pop(key, None)
        self.metrics.inc("dsagent_fetches_total", result="ok")
        self.metrics.inc("dsagent_fetch_seconds_total", time.monotonic() - started)
        log.info("cached %s@%s: %d files, %s", manifest.name, manifest.digest[:12], manifest.file_count, format_size(manifest.total_bytes))
        await self._collect_superseded(manifest.name)

    async def _fetch_reserved(self, source: Source, manifest: Manifest) -> None:
        key = (manifest.name, manifest.digest)
        await self._db(
            self.catalog.begin_version, *key, size_bytes=manifest.total_bytes, files=manifest.file_count,
            source=source.url, bundles=source.bundles if manifest.bundles else None, now=self.clock(),
        )
        await self._work(self.store.write_manifest, *key, manifest.to_bytes())
        staging = self.store.staging_dir(*key)
        await self._work(lambda: staging.mkdir(parents=True, exist_ok=True))
        progress = self._progress[key] = Progress(manifest.total_bytes, manifest.file_count)
        workers = self.settings.fetch_workers
        if manifest.bundles and source.bundles:
            done = await self._db(self.catalog.bundles_done, *key)

            async def record(bundle: BundleRef) -> None:
                await self._db(self.catalog.bundle_done, *key, bundle.digest)

            async with self._space_lock:  # no eviction is half done on a version we link from
                local = await self._local_bundles(manifest)
                origins = Counter((path.parent.name, path.name) for path in set(local.values()))
                self._pins.update(origins)
            try:
                await fetch_bundles(source, manifest, staging, done=done, on_bundle_done=record, local=local, progress=progress, executor=self._pool, workers=workers)
            finally:
                self._pins.subtract(origins)
                self._pins = +self._pins
        else:
            await fetch_files(source, manifest, staging, progress=progress, executor=self._pool, workers=workers)
        await self._work(finish, staging, manifest)
        self.metrics.inc("dsagent_fetched_bytes_total", progress.bytes_done)
        await self._work(self.store.publish, *key)
        await self._db(self.catalog.mark_ready, *key, now=self.clock())

    async def _local_bundles(self, manifest: Manifest) -> dict[str, Path]:
        """Bundles of ``manifest`` that another ready version of the dataset already holds."""
        wanted = {b.digest for b in manifest.bundles}
        found: dict[str, Path] = {}
        for row in await self._db(self.catalog.versions, manifest.name):
            if row.state != "ready" or row.digest == manifest.digest:
                continue
            other = await self._stored_manifest(row.name, row.digest)
            for bundle in other.bundles if other else ():
                if bundle.digest in wanted:
                    found.setdefault(bundle.digest, self.store.ready_dir(row.name, row.digest))
        return found

    # -- space ------------------------------------------------------------------------

    async def _reserve(self, key: Key, size: int) -> None:
        """Reserve ``size`` bytes for ``key``, evicting LRU unused datasets to reach ratio x size."""
        async with self._space_lock:
            while True:
                free = await self._free_bytes()
                candidates = await self._candidates()
                plan = eviction.plan_for_fetch(candidates, size=size, free=free, ratio=self.settings.evict_ratio)
                if not plan.sufficient:
                    raise InsufficientSpace(
                        f"not enough space to cache {key[0]} ({format_size(size)}): "
                        f"needed {format_size(plan.needed_bytes)}, free {format_size(plan.free_bytes)}, "
                        f"evictable {format_size(plan.evictable_bytes)}",
                        hint="release tasks that no longer need their datasets, or give the cache more space",
                        needed=plan.needed_bytes, free=plan.free_bytes, evictable=plan.evictable_bytes,
                    )
                evicted = [await self._evict_one(victim, reason="space") for victim in plan.victims]
                if all(evicted):
                    self._reservations[key] = size
                    return
                # a victim became protected since the plan was made: plan again on the new view

    async def _free_bytes(self) -> int:
        """Free bytes for new data: disk free and capacity left, minus pending reservations."""
        disk = await self._work(self.store.disk_usage)
        pending = sum(max(0, size - self._done(key)) for key, size in self._reservations.items())
        free = disk.free - pending
        if self.settings.capacity_bytes is not None:
            rows = await self._db(self.catalog.versions)
            reserved = sum(self._reservations.values())
            # a version just committed ready may still hold its reservation: count it once
            held = sum(r.size_bytes for r in rows if r.state == "ready" and (r.name, r.digest) not in self._reservations)
            free = min(free, self.settings.capacity_bytes - held - reserved)
        return free

    def _done(self, key: Key) -> int:
        progress = self._progress.get(key)
        return progress.bytes_done if progress else 0

    async def _candidates(self) -> list[eviction.Candidate]:
        rows = await self._db(self.catalog.versions)
        in_use = await self._db(self.catalog.in_use, self.clock())
        in_use |= {(name, digest) for (_, name), (_, digest) in self._claims.items() if digest is not None}
        fetching = {key[1:] for key in self._flights if key[0] == "fetch"} | set(self._pins)
        return [
            eviction.Candidate(
                r.name, r.digest, r.size_bytes, r.last_used or r.created_at,
                in_use=(r.name, r.digest) in in_use, fetching=(r.name, r.digest) in fetching or r.state == "fetching",
            )
            for r in rows
            if r.state in ("ready", "failed")
        ]

    async def _evict_one(self, victim: eviction.Candidate, *, reason: str, force: bool = False) -> bool:
        """Delete one version chosen by a plan, unless it became protected since (then
        False). Called under the space lock only, so no two deletions of one version
        overlap and no fetch publishes a version while it is being removed."""
        key = (victim.name, victim.digest)
        if not force and self._protected(key):
            return False
        unless = None if force else self.clock()
        if not await self._db(self.catalog.delete_version, *key, unless_in_use_at=unless) and not force:
            return False  # a task was bound to it after the plan was made
        log.info("evicting %s@%s (%s, %s)", victim.name, victim.digest[:12], format_size(victim.size_bytes), reason)
        await self._work(self.store.remove, *key)
        self.metrics.inc("dsagent_evictions_total", reason=reason)
        self.metrics.inc("dsagent_evicted_bytes_total", victim.size_bytes)
        return True

    async def _collect_superseded(self, name: str | None = None) -> None:
        """Delete old versions no task holds: a name keeps its current version (the one
        its latest consistency check resolved to) and the versions tasks still use."""
        async with self._space_lock:
            rows = await self._db(self.catalog.versions, name)
            current: dict[str, VersionRow] = {}
            for row in rows:  # ordered by resolved_at: the last ready one per name wins
                if row.state == "ready":
                    current[row.name] = row
            for c in await self._candidates():
                if (name is None or c.name == name) and c.evictable and c.name in current and current[c.name].digest != c.digest:
                    await self._evict_one(c, reason="superseded")

    async def evict(self, *, names: Sequence[str] = (), mode: str = "names", force: bool = False, dry_run: bool = False, free_bytes: int = 0) -> EvictionResult:
        """Operator eviction: named datasets, ``idle`` ones, ``unused`` ones, or enough for ``space``."""
        async with self._space_lock:
            candidates = await self._candidates()
            victims = await self._choose(candidates, names=names, mode=mode, force=force, free_bytes=free_bytes)
            if not dry_run:
                reason = "operator" if mode == "names" else mode
                victims = [v for v in victims if await self._evict_one(v, reason=reason, force=force and mode == "names")]
        return EvictionResult(tuple(victims), dry_run, sum(v.size_bytes for v in victims))

    async def _choose(self, candidates: list[eviction.Candidate], *, names: Sequence[str], mode: str, force: bool, free_bytes: int) -> list[eviction.Candidate]:
        if mode == "idle":
            return list(eviction.idle_victims(candidates, now=self.clock(), idle_ttl=self.settings.idle_ttl))
        if mode == "unused":
            return list(eviction.unused_victims(candidates))
        if mode == "space":
            plan = eviction.plan_for_fetch(candidates, size=free_bytes, free=await self._free_bytes(), ratio=1.0)
            return list(plan.victims)
        if mode != "names":
            raise InvalidInput(f"unknown eviction mode {mode!r}", hint="use names, idle, unused or space")
        return await self._named_victims(candidates, names, force)

    async def _named_victims(self, candidates: list[eviction.Candidate], names: Sequence[str], force: bool) -> list[eviction.Candidate]:
        victims: list[eviction.Candidate] = []
        rows = await self._db(self.catalog.versions)
        for name in names:
            validate_name(name)
            mine = [c for c in candidates if c.name == name]
            if not mine and not any(r.name == name for r in rows):
                raise NotFound(f"no dataset {name!r} in the cache")
            if any(r.name == name and r.state == "fetching" for r in rows) or any(c.fetching for c in mine):
                raise Conflict(f"dataset {name!r} is being fetched", hint="wait for the fetch to finish, then evict")
            busy = [c for c in mine if c.in_use]
            if busy and not force:
                raise Conflict(f"dataset {name!r} is in use by a task", hint="release the task first, or pass --force")
            victims += mine
        return victims

    # -- the idle sweep ---------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval)
            try:
                await self.sweep()
            except Exception:
                log.exception("the idle sweep failed; retrying at the next interval")

    async def sweep(self) -> None:
        """Lapse expired leases, delete superseded versions, evict idle datasets."""
        for task_id in await self._db(self.catalog.expired_tasks, self.clock()):
            log.info("lease of task %s lapsed; releasing it", task_id)
            with contextlib.suppress(NotFound):
                await self.release_task(task_id)
        await self._collect_superseded()
        await self.evict(mode="idle")

    # -- reports ----------------------------------------------------------------------

    async def datasets(self) -> list[dict[str, Any]]:
        """Every cached version with its state, use and progress (``GET /v1/datasets``)."""
        rows = await self._db(self.catalog.versions)
        in_use = await self._db(self.catalog.in_use, self.clock())
        return [self._version_view(r, (r.name, r.digest) in in_use) for r in rows]

    async def dataset(self, name: str) -> list[dict[str, Any]]:
        validate_name(name)
        views = [v for v in await self.datasets() if v["name"] == name]
        if not views:
            raise NotFound(f"no dataset {name!r} in the cache")
        return views

    def _version_view(self, row: VersionRow, in_use: bool) -> dict[str, Any]:
        progress = self._progress.get((row.name, row.digest))
        working = ("fetch", row.name, row.digest) in self._flights or any(
            name == row.name and not waiter.done() for (_, name), waiter in self._waiters.items()
        )
        fetching = row.state != "ready" and working
        state = "fetching" if fetching else ("failed" if row.state != "ready" else "ready")
        return {
            "name": row.name, "digest": row.digest, "state": state, "sizeBytes": row.size_bytes, "files": row.files,
            "inUse": in_use, "lastUsed": iso(row.last_used), "createdAt": iso(row.created_at), "readyAt": iso(row.ready_at),
            "source": redact_url(row.source), "bundles": redact_url(row.bundles), "error": row.error if state == "failed" else None,
            "path": str(self.store.ready_dir(row.name, row.digest)) if state == "ready" else None,
            "bytesDone": progress.bytes_done if progress else (row.size_bytes if state == "ready" else 0),
            "filesDone": progress.files_done if progress else (row.files if state == "ready" else 0),
        }

    async def space(self) -> dict[str, int]:
        rows = await self._db(self.catalog.versions)
        disk = await self._work(self.store.disk_usage)
        used = sum(r.size_bytes for r in rows if r.state == "ready")
        capacity = self.settings.capacity_bytes if self.settings.capacity_bytes is not None else disk.total
        return {"capacityBytes": capacity, "freeBytes": max(0, await self._free_bytes()), "usedBytes": used}

    async def inventory(self) -> dict[str, Any]:
        """The node report of the inventory contract (``GET /v1/inventory``, the Node annotation)."""
        space = await self.space()
        by_name: dict[str, list[dict[str, Any]]] = {}
        for view in await self.datasets():
            by_name.setdefault(view["name"], []).append(view)
        datasets: dict[str, Any] = {}
        for name, views in sorted(by_name.items()):
            newest = views[-1]  # versions come in resolution order: the last is current
            entry = {key: newest[key] for key in ("digest", "sizeBytes", "files", "state", "inUse", "lastUsed")}
            if len(views) > 1:
                entry["versions"] = [{key: v[key] for key in ("digest", "state", "inUse", "sizeBytes")} for v in views]
            datasets[name] = entry
        return {"version": 1, "node": self.settings.node_name, "capacityBytes": space["capacityBytes"], "freeBytes": space["freeBytes"], "datasets": datasets}

    async def metrics_text(self) -> str:
        space = await self.space()
        views = await self.datasets()
        tasks = await self._db(self.catalog.tasks)
        samples = [
            Sample("dsagent_free_bytes", space["freeBytes"]),
            Sample("dsagent_used_bytes", space["usedBytes"]),
            Sample("dsagent_capacity_bytes", space["capacityBytes"]),
            Sample("dsagent_tasks", len(tasks)),
        ]
        for state in ("ready", "fetching", "failed"):
            samples.append(Sample("dsagent_datasets", sum(1 for v in views if v["state"] == state), (("state", state),)))
        return self.metrics.render(samples)


def _is_local_url(source: Source) -> bool:
    fs, _ = resolve(source.url, source.storage_options)
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return bool({"file", "local"} & set(protocols))


def _check_same_request(existing: TaskRow, requests: Sequence[DatasetRequest]) -> None:
    before = sorted((d["name"], d["source"], d.get("bundles")) for d in existing.request)
    after = sorted(r.identity for r in requests)
    if before != after:
        raise Conflict(
            f"task {existing.task_id!r} already holds a different set of datasets",
            hint="a task's request cannot change; release the task first or use a new task id",
        )


__all__ = ["CacheService", "DatasetRequest", "DatasetStatus", "EvictionResult", "TaskRecord", "iso", "redact_url"]
