"""The agent's one coordinator: tasks, leases, consistency checks, single-flight fetches,
space and the idle sweep.

Who calls it: the HTTP API (:mod:`dsagent.api`) and, in cluster mode, the Kubernetes
integration (``dsagent.nodeagent.clusteragent.ClusterAgent``); nothing else calls the parts it
coordinates, so every node-cache rule (docs/design.md#rules) is enforced from here:

1. One request per task: :meth:`CacheService.submit_task` is idempotent per task id;
   repeating it renews the lease and starts no new work.
2. Consistency: each new request for a dataset resolves the source's current digest
   (:mod:`dsagent.cache.versions`) and a cached copy is a hit only when it is ready with that
   digest. A changed source gets a new version beside the old; the old one goes once no
   task holds it.
4. Space: a fetch reserves its size first; below ``evict_ratio x size`` free, datasets
   neither in use nor fetching are evicted least recently used first (:mod:`dsagent.cache.space`
   applies :mod:`dsagent.policy.eviction`), else the request fails with the numbers. A version is
   protected from the moment a task asks for it (:mod:`dsagent.cache.claims`) until the task is
   released.
6. Concurrency: ``max_fetches`` datasets at once, ``fetch_workers`` threads each;
   concurrent requests for one dataset version share one fetch (:mod:`dsagent.cache.flights`).

The parts: :mod:`dsagent.cache.pools` (threads), :mod:`dsagent.cache.space`, :mod:`dsagent.cache.versions`
(both take the :class:`dsagent.cache.node.Node` it builds once: the node's shared state),
:mod:`dsagent.cache.progress`, :mod:`dsagent.cache.recovery` (after a crash :meth:`start` reconciles
catalog and disk and resumes interrupted fetches), :mod:`dsagent.cache.report` (answers) and
:mod:`dsagent.cache.striped.stophandoff` (told to stop, its stripe shares handed off first).
Everything runs on one event loop; blocking work goes to the pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dsagent.cache import ready, recovery, report
from dsagent.cache.catalog import Catalog, TaskRow
from dsagent.cache.claims import Claims
from dsagent.cache.fetch import Source
from dsagent.cache.fetchlinks import Links, resolve_addresses
from dsagent.cache.flights import Flights
from dsagent.cache.layout import Store, validate_name
from dsagent.cache.metrics import Metrics
from dsagent.cache.node import Node
from dsagent.cache.peers import PeerFetcher, PeerServer
from dsagent.cache.pools import Pools
from dsagent.cache.prepared import Preparations, preparation_view
from dsagent.cache.preparedparts import service_parts
from dsagent.cache.progress import ProgressBoard
from dsagent.cache.servicehooks import ServiceHooks
from dsagent.cache.settings import Settings
from dsagent.cache.space import EvictionResult, Space
from dsagent.cache.striped.servedbundles import BundleLocator
from dsagent.cache.striped.stophandoff import StripeHandoff
from dsagent.cache.striped.stripes import StripeShares
from dsagent.cache.task import (
    DatasetRequest,
    DatasetStatus,
    TaskRecord,
    check_locations,
    check_same_request,
    iso,
    redact_url,
    task_key,
    validate_request,
)
from dsagent.cache.versions import Versions
from dsagent.errors import AgentStopping, DsagentError, IntegrityError, NotFound, local_write_error
from dsagent.format.manifest import Manifest
from dsagent.format.storage import add_store_observer, protocol_label
from dsagent.format.storage_errors import classify
from dsagent.format.storageconfig import with_config
from dsagent.policy.eviction import Candidate

log = logging.getLogger("dsagent")
_T = TypeVar("_T")


class CacheService:
    """The coordinator; create it, ``await start()``, use it, ``await stop()``."""

    def __init__(
        self, settings: Settings, *, clock: Callable[[], float] = time.time, hooks: ServiceHooks = ServiceHooks()
    ) -> None:
        self.settings = settings
        self.clock = clock
        # what cluster mode lends: the task check and the peer list (dsagent.cache.servicehooks)
        self.hooks = hooks
        self.metrics = Metrics(protocols=sorted({protocol_label(p) for p in settings.protocols}))
        self._stop_observing: Callable[[], None] | None = None
        self.store = Store(settings.root)
        self.pools = Pools(settings.max_fetches * settings.fetch_workers + 2)
        self._catalog: Catalog | None = None
        self._submit_lock = asyncio.Lock()
        self._flights = Flights()
        self._claims = Claims()
        self._progress = ProgressBoard()
        self.node = Node(
            settings=settings,
            pools=self.pools,
            catalog=lambda: self.catalog,
            store=self.store,
            clock=clock,
            metrics=self.metrics,
            claims=self._claims,
            flights=self._flights,
            progress=self._progress,
        )
        self._space = Space(self.node)
        self.peers = PeerFetcher(settings, self.store, self.metrics, cluster_holders=hooks.peer_holders)
        self.links = Links((), self.metrics)  # DSAGENT_FETCH_LINKS, resolved at start (docs/design.md#links)
        self._versions = Versions(self.node, space=self._space, peers=self.peers, links=self.links)
        self.stripes = StripeShares(
            settings,
            self.pools,
            self.peers,
            clock=clock,
            make_room=self._space.make_room,
            disk=self.node.store.allocated,
        )
        self._space.shares = self.stripes  # shares count in the space and are evicted in order
        self._served = BundleLocator(
            self.node, space=self._space, versions=self._versions, stripes=self.stripes, peers=self.peers
        )
        self.peer_server = PeerServer(settings, self.metrics, self._served.locate, self._served.unpin)
        self._waiters: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._errors: dict[tuple[str, str], DsagentError] = {}
        self._options: dict[tuple[str, str], Mapping[str, Any] | None] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._stripes_back: asyncio.Task[None] | None = None
        self._checking: set[tuple[str, str]] = set()  # (task, dataset) under the start check
        self._handovers: set[asyncio.Task[None]] = set()
        self.preparations = Preparations(  # docs/design.md#next-job-preparation
            service_parts(
                self.node,
                self._space,
                submit_task=self.submit_task,
                get_task=self.get_task,
                release_task=self.release_task,
            )
        )
        self.started = False
        # told to stop: its stripe shares handed to their new owners first (docs/design-striping.md#churn)
        self.handoff = StripeHandoff(settings, self.stripes, clock, hooks.node_leaving)

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._served.loop = asyncio.get_running_loop()
        # every object opened in a store, timed and its errors counted by protocol (docs/design.md#metrics)
        self._stop_observing = add_store_observer(self.metrics.store_request)
        self._catalog = await recovery.open_catalog(
            self.pools, self.store, self.metrics, workers=self.settings.fetch_workers, now=self.clock()
        )
        await recovery.reconcile(self.pools, self.catalog, self.store, now=self.clock)
        if self.settings.fetch_links:
            self.links.addresses = await self.pools.work(resolve_addresses, self.settings)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="dsagent-sweep")
        self._stripes_back = asyncio.create_task(self.stripes.recover(), name="dsagent-stripes")
        for task_id, request, digest in await recovery.interrupted(self.pools, self.catalog, now=self.clock()):
            try:  # the operator may have narrowed the allowlist since the request was taken
                await self.pools.check(check_locations, request, policy=self.settings.source_policy)
            except DsagentError as exc:
                log.warning("not resuming %s for task %s: %s", request.name, task_id, exc)
                self._errors[(task_id, request.name)] = exc
                continue
            self._start_waiter(task_id, request, digest)
        self.started = True

    async def stop(self) -> None:
        self.started = False
        if self._stop_observing is not None:
            self._stop_observing()
        tasks = [
            t
            for t in (
                self._sweeper,
                self._stripes_back,
                *self._waiters.values(),
                *self._handovers,
                *self._flights.futures(),
            )
            if t is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.stripes.stop()
        self.pools.shutdown_workers()
        self.peers.close()
        if self._catalog is not None:
            await self._db(self._catalog.close)
        self.pools.shutdown_catalog()

    async def _db(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await self.pools.db(fn, *args, **kwargs)

    async def _work(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await self.pools.work(fn, *args, **kwargs)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            raise RuntimeError("CacheService.start() was not awaited")
        return self._catalog

    # -- tasks ------------------------------------------------------------------------

    async def submit_task(
        self,
        task_id: str,
        datasets: Sequence[DatasetRequest],
        *,
        wait: float | None = None,
        tenant: str | None = None,
    ) -> TaskRecord:
        """Ask for a task's datasets (idempotent); with ``wait``, wait up to that many seconds.
        ``task_id`` in any case names one task (:func:`task_key`). ``tenant``: the namespace
        the task acts for (docs/operator-guide/tenancy.md): a new task of a namespace that already pins its
        share of the cache is refused (:class:`NamespaceShareExceeded`) before any work, and
        the namespace is recorded as one that asked for each dataset's source."""
        try:
            task_id = task_key(task_id)
            requests = await self._validate(task_id, datasets)
        except DsagentError as exc:  # refused before any work: still a failed request
            for _ in datasets or (None,):
                self.metrics.request_settled(exc.code)
            raise
        now = self.clock()
        lease_until = now + self.settings.lease_ttl
        admit_task = self.hooks.admit_task
        if admit_task is not None and await self._db(self.catalog.task, task_id) is None:
            # Admission may wait (e.g. for the pod watch to see the pod): do it before the
            # lock so it never holds up other tasks' requests.
            await admit_task(task_id)
        async with self._submit_lock:  # the same task id sent twice at once is still one task
            existing = await self._db(self.catalog.task, task_id)
            if existing is None and self.handoff.stopping:
                for _ in requests:
                    self.metrics.request_settled(AgentStopping.code)
                raise AgentStopping(
                    "this agent is stopping: it takes no new task",
                    hint="ask again once the agent that replaces it serves (or on another node)",
                )
            if existing is None and tenant is not None:
                await self._space.check_share(tenant, [(r.name, r.source) for r in requests], now)
            if existing is None:
                await self._db(
                    self.catalog.create_task,
                    task_id,
                    [r.redacted() for r in requests],
                    now=now,
                    lease_until=lease_until,
                )
                existing = await self._db(self.catalog.task, task_id)
                assert existing is not None
            else:
                check_same_request(existing, requests)
                await self._db(self.catalog.renew_task, task_id, lease_until)
                await self._db(self.catalog.touch_task, task_id, now)
            if tenant is not None:
                await self._db(self.catalog.record_tenant, task_id, tenant, [(r.name, r.source) for r in requests])
            for request in requests:
                self._options[(task_id, request.name)] = request.storage_options
                await self._ensure(task_id, request, existing.digests.get(request.name))
            if self.preparations.get(task_id) is not None:  # the prepared task arrived: hand over
                mine = [t for (tid, _), t in self._waiters.items() if tid == task_id]
                handover = asyncio.create_task(
                    self.preparations.hand_over(task_id, mine), name=f"dsagent-handover-{task_id}"
                )
                self._handovers.add(handover)
                handover.add_done_callback(self._handovers.discard)
        if wait:
            await self._wait_for(task_id, wait)
        return await self.get_task(task_id)

    async def tenant_pinned(self, tenant: str) -> int:
        """Bytes the live tasks acting for ``tenant`` hold on this node."""
        return int(await self._db(self.catalog.tenant_pinned, tenant, self.clock()))

    async def _validate(self, task_id: str, datasets: Sequence[DatasetRequest]) -> list[DatasetRequest]:
        validate_request(task_id, datasets)
        for request in datasets:  # resolving a location may touch the network: off the loop
            await self.pools.check(check_locations, request, policy=self.settings.source_policy)
        return list(datasets)

    async def _ensure(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        """Start the work a task's dataset still needs, unless it is running or done."""
        waiter = self._waiters.get((task_id, request.name))
        if waiter is not None and not waiter.done():
            return
        if bound is not None:
            row = await self._db(self.catalog.version, request.name, bound)
            if row is not None and row.state == "ready":
                return  # docs/design.md#rule-1: a repeated request starts no new work
        self._errors.pop((task_id, request.name), None)
        self._start_waiter(task_id, request, bound)

    def _start_waiter(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        self._claims.ask(task_id, request.identity)  # protected from now on, once its digest is known
        task = asyncio.create_task(self._serve(task_id, request, bound), name=f"dsagent-task-{task_id}-{request.name}")
        self._waiters[(task_id, request.name)] = task

    async def _serve(self, task_id: str, request: DatasetRequest, bound: str | None) -> None:
        """Serve one dataset of one task, in two steps; errors are kept for the record.

        1. :meth:`_version_for`: the version the task means (the one it is bound to, else
           the source's current one, resolved once per request identity);
        2. :meth:`_make_ready`: that version fetched and made ready, once per version
           (:meth:`dsagent.cache.versions.Versions.fetch`), unless resolving it cached it.
        """
        # every filesystem built for this dataset (source, bundle store) gets the storage
        # bounds of the settings: they travel in its options (dsagent.format.storageconfig)
        options = with_config(self._options.get((task_id, request.name)), self.settings.storage_config)
        source = Source(request.source, request.bundles, options)
        try:
            manifest, cached = await self._version_for(task_id, request, source, bound)
            if not cached:
                await self._make_ready(source, manifest)
            if (manifest.name, manifest.digest) in self.preparations.prepared_keys(task_id):
                await self._start_check(task_id, request.name, source, manifest)
        except asyncio.CancelledError:
            raise
        except DsagentError as exc:
            self._failed(task_id, request, exc)
        except Exception as exc:  # a foreign storage error, or a bug: keep it visible, never crash the loop
            what = f"dataset {request.name!r}"
            if isinstance(exc, OSError) and self._on_cache_disk(exc):
                known: DsagentError | None = local_write_error(exc, what)  # the node's disk, not the source
            else:
                known = classify(exc, what)
            if known is not None:
                self._failed(task_id, request, known)
                return
            log.exception("caching %s for task %s failed", request.name, task_id)
            self._failed(task_id, request, DsagentError(f"internal error: {type(exc).__name__}: {exc}"), logged=True)
        else:
            self.metrics.request_settled("ok")

    async def _version_for(
        self, task_id: str, request: DatasetRequest, source: Source, bound: str | None
    ) -> tuple[Manifest, bool]:
        """Step 1: the version ``task_id`` means by ``request``, and whether resolving it
        cached it already (a per-file copy digests while it copies).

        A task keeps the version it was bound to (docs/design.md#rule-1), unless that
        version's fetch was abandoned (an integrity failure, a full disk: its staging is
        gone): then the source is resolved again, so a repeated request after "the source
        changed while caching" gets the source as it is now, not the stale version again."""
        stored = await self._bound_manifest(request.name, bound)
        if stored is not None:
            self._claims.drop(task_id, request.name)  # the catalog binding protects it
            return stored, False
        flight = ("resolve", *request.identity, request.allow_per_file)
        manifest, cached = await self._flights.join(flight, self._resolve, request, source)
        await self._bind(task_id, request, manifest.digest)
        return manifest, cached

    async def _bound_manifest(self, name: str, bound: str | None) -> Manifest | None:
        """The stored manifest of the version a task is bound to, while it can still be fetched."""
        if bound is None:
            return None
        row = await self._db(self.catalog.version, name, bound)
        if row is None:
            return None
        if row.state == "failed" and not await self._work(self.store.staging_dir(name, bound).is_dir):
            return None  # abandoned (Versions.fetch removed its staging): resolve the source again
        return await self._versions.stored_manifest(name, bound)

    async def _make_ready(self, source: Source, manifest: Manifest) -> None:
        """Step 2: ``manifest``'s version fetched and made ready, one fetch per version
        however many tasks wait for it (docs/design.md#rule-6)."""
        await self._flights.join(("fetch", manifest.name, manifest.digest), self._versions.fetch, source, manifest)

    async def _start_check(self, task_id: str, name: str, source: Source, manifest: Manifest) -> None:
        """The start check (docs/design.md#next-job-preparation): a version prepared for
        ``task_id`` is checked on disk against its manifest before the task is told it is
        ready; a copy that fails is evicted and fetched again."""
        key = (manifest.name, manifest.digest)
        self._checking.add((task_id, name))
        try:
            try:
                await self._work(ready.check_complete, self.store.ready_dir(*key), manifest)
                return
            except IntegrityError as exc:
                log.warning("prepared copy of %s failed the start check; fetching it again: %s", name, exc)
            async with self._space.lock:
                victim = Candidate(*key, self.store.allocated(manifest.total_bytes, manifest.file_count), 0.0)
                await self._space.evict_one(victim, reason="start-check", force=True)
            await self._make_ready(source, manifest)
        finally:
            self._checking.discard((task_id, name))

    def _on_cache_disk(self, exc: OSError) -> bool:
        """Whether ``exc`` is the cache disk's failure (on a path under the root), not the
        source's: staging, publishing and finishing a version touch only the root."""
        if not exc.filename:
            return False
        root = os.path.realpath(self.settings.root)
        return os.path.realpath(os.fsdecode(exc.filename)).startswith(root + os.sep)

    def _failed(self, task_id: str, request: DatasetRequest, exc: DsagentError, *, logged: bool = False) -> None:
        """Keep a dataset's failure for its task, count it by code, and log it once at
        WARNING with code, task, dataset and source (passwords in URLs redacted; storage
        options never logged), so that no failed task goes without a warning line."""
        self._errors[(task_id, request.name)] = exc
        self.metrics.request_settled(exc.code)
        if not logged:
            source, bundles = redact_url(request.source), redact_url(request.bundles)
            log.warning(
                "dataset failed: code=%s task=%s dataset=%s source=%s bundles=%s: %s",
                exc.code,
                task_id,
                request.name,
                source,
                bundles,
                exc,
                # the same facts as fields of a JSON log line (DSAGENT_LOG_FORMAT=json)
                extra={"code": exc.code, "task": task_id, "dataset": request.name, "source": source}
                | {"bundles": bundles},
            )

    async def _resolve(self, request: DatasetRequest, source: Source) -> tuple[Manifest, bool]:
        resolved = await self._versions.resolve(request.name, source, allow_per_file=request.allow_per_file)
        self._claims.settle(request.identity, resolved[0].digest)  # every task waiting on this flight
        return resolved

    async def _bind(self, task_id: str, request: DatasetRequest, digest: str) -> None:
        self._claims.hold(task_id, request.identity, digest)
        await self._db(self.catalog.bind, task_id, request.name, digest)
        self._claims.drop(task_id, request.name)  # from here the catalog's binding protects it

    async def _wait_for(self, task_id: str, timeout: float) -> None:
        waiters = [t for (tid, _), t in self._waiters.items() if tid == task_id and not t.done()]
        if waiters:
            await asyncio.wait(waiters, timeout=timeout)

    async def get_task(self, task_id: str) -> TaskRecord:
        task_id = task_key(task_id)
        task = await self._db(self.catalog.task, task_id)
        if task is None:
            raise NotFound(
                f"no task {task_id!r} on this agent", hint="submit it with PUT /v1/tasks/{task} or dsctl cache"
            )
        statuses = [await self._dataset_status(task, item) for item in task.request]
        return TaskRecord(task.task_id, task.created_at, task.lease_until, tuple(statuses))

    async def pod_names_dataset(self, pod_uid: str, name: str) -> bool:
        """Whether the pod ``pod_uid`` asks for dataset ``name``: its own task (the task id is
        its UID) lists it, or (cluster mode) its annotation does. A pod reads a striped
        version's bundles only then (docs/design-striping.md#agent)."""
        task = await self._db(self.catalog.task, task_key(pod_uid))
        if task is not None and any(item.get("name") == name for item in task.request):
            return True
        hook = self.hooks.pod_datasets
        names = await hook(pod_uid) if hook is not None else None
        return names is not None and name in names

    async def _dataset_status(self, task: TaskRow, item: dict[str, Any]) -> DatasetStatus:
        name = item["name"]
        digest = task.digests.get(name)
        row = await self._db(self.catalog.version, name, digest) if digest else None
        waiter = self._waiters.get((task.task_id, name))
        return report.dataset_status(
            item,
            digest,
            row,
            error=self._errors.get((task.task_id, name)),
            waiting=waiter is not None and not waiter.done(),
            fetching=row is not None and self._flights.is_fetching((name, row.digest)),
            pending=self._progress.pending(name, item["source"]),
            progress=self._progress.get((name, row.digest)) if row else None,
            path=str(self.store.ready_dir(name, row.digest)) if row else None,
            checking=(task.task_id, name) in self._checking,
        )

    async def task_ids(self) -> list[str]:
        """The ids of every task this agent holds, oldest first (released ones are gone)."""
        return await self._db(self.catalog.task_ids)

    async def release_task(self, task_id: str) -> None:
        """The task no longer needs its datasets (the pod ended); they become evictable."""
        task_id = task_key(task_id)
        for (tid, name), waiter in list(self._waiters.items()):
            if tid == task_id:
                waiter.cancel()
                self._waiters.pop((tid, name), None)
                self._errors.pop((tid, name), None)
                self._options.pop((tid, name), None)
        self._claims.release(task_id)
        await self._db(self.catalog.touch_task, task_id, self.clock())  # idle time counts from here
        if not await self._db(self.catalog.delete_task, task_id):
            raise NotFound(f"no task {task_id!r} on this agent")
        await self._space.collect_superseded()

    # -- preparations (docs/design.md#next-job-preparation) -------------------------------

    async def prepare(
        self,
        task_id: str,
        datasets: Sequence[DatasetRequest],
        *,
        phase: int = 1,
        first: float,
        second: float,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Prepare the next task ``task_id`` here (idempotent; each call renews its lease)."""
        task_id = task_key(task_id)
        requests = await self._validate(task_id, datasets)
        prep = await self.preparations.put(task_id, requests, phase=phase, first=first, second=second, tenant=tenant)
        return preparation_view(prep)

    async def release_preparation(self, task_id: str) -> None:
        await self.preparations.release(task_key(task_id))

    # -- eviction and the idle sweep ----------------------------------------------------

    async def evict(self, **request: Any) -> EvictionResult:
        """Operator eviction, as :meth:`dsagent.cache.space.Space.evict` (the same keyword
        arguments: named datasets, ``idle`` ones, ``unused`` ones, or enough for ``space``;
        ``tenant`` for one namespace); the catalog's ballast is kept up once something went."""
        result = await self._space.evict(**request)
        if result.evicted:
            await self._db(self.catalog.keep_ballast)
        return result

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
        await self.stripes.expire()  # shares no holder renewed
        await self._space.collect_superseded()
        await self.preparations.lapse()
        await self.preparations.refresh()  # a released task may let a waiting preparation go on
        await self.evict(mode="idle")
        await self._db(self.catalog.keep_ballast)  # given back to a full disk earlier: take it again

    # -- reports ----------------------------------------------------------------------

    async def datasets(self) -> list[dict[str, Any]]:
        """Every cached version with its state, use and progress (``GET /v1/datasets``)."""
        rows = await self._db(self.catalog.versions)
        in_use = await self._db(self.catalog.in_use, self.clock())
        working = {name for (_, name), waiter in self._waiters.items() if not waiter.done()}
        return [
            report.version_view(
                r,
                in_use=(r.name, r.digest) in in_use,
                working=self._flights.is_fetching((r.name, r.digest)) or r.name in working,
                progress=self._progress.get((r.name, r.digest)),
                path=str(self.store.ready_dir(r.name, r.digest)),
            )
            for r in rows
        ]

    async def dataset(self, name: str) -> list[dict[str, Any]]:
        validate_name(name)
        views = [v for v in await self.datasets() if v["name"] == name]
        if not views:
            raise NotFound(f"no dataset {name!r} in the cache")
        return views

    async def space(self) -> dict[str, int]:
        return await self._space.report()

    async def inventory(self) -> dict[str, Any]:
        """The node report of the inventory contract (``GET /v1/inventory``, the Node annotation)."""
        return report.inventory(
            await self.datasets(), await self.space(), self.settings.node_name, self.stripes.inventory()
        )

    async def metrics_text(self) -> str:
        """``GET /metrics``: the counters and the gauges of this moment (see :mod:`dsagent.cache.metrics`)."""
        failed = {tid for (tid, _name) in self._errors}
        tasks = await self._db(self.catalog.task_ids)
        working = {tid for (tid, _), waiter in self._waiters.items() if not waiter.done()}
        states = report.task_states(tasks, failed=failed, working=working)
        self.metrics.set_gauges(await self.space(), (v["state"] for v in await self.datasets()), states)
        return self.metrics.render()


__all__ = ["CacheService", "DatasetRequest", "DatasetStatus", "EvictionResult", "TaskRecord", "iso", "redact_url"]
