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
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dsagent.cache import recovery, report
from dsagent.cache.catalog import Catalog, TaskRow
from dsagent.cache.claims import Claims
from dsagent.cache.fetchlinks import NO_LINKS, LinkChoice, Links, choose_links
from dsagent.cache.flights import Flights
from dsagent.cache.layout import Store, validate_name
from dsagent.cache.metrics import Metrics
from dsagent.cache.namespacepins import NamespacePins
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
from dsagent.cache.taskwork import TaskWork
from dsagent.cache.versions import Versions
from dsagent.errors import AgentStopping, DsagentError, NotFound
from dsagent.format.storage import add_store_observer, protocol_label

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
        # DSAGENT_FETCH_LINKS, resolved at start (docs/design.md#links)
        self.links = Links((), self.metrics, range_min=self.settings.fetch_range_min, netns=self.settings.node_netns)
        # which links, and why (said on the Node in cluster mode); set by start()
        self.link_choice: LinkChoice = NO_LINKS
        self._versions = Versions(self.node, space=self._space, peers=self.peers, links=self.links)
        self.stripes = StripeShares(
            settings,
            self.pools,
            self.peers,
            clock=clock,
            make_room=self._space.make_room,
            disk=self.node.store.allocated,
            capacity=self._capacity,
            pods_reported=hooks.reports_pods,
            metrics=self.metrics,
        )
        self._space.shares = self.stripes  # shares count in the space and are evicted in order
        self._served = BundleLocator(
            self.node, space=self._space, versions=self._versions, stripes=self.stripes, peers=self.peers
        )
        self.peer_server = PeerServer(settings, self.metrics, self._served.locate, self._served.unpin)
        self._taskwork = TaskWork(self.node, self._versions, self._space)  # each dataset's route to ready
        # the namespaces' shares of this cache, reserved at admission (docs/operator-guide/tenancy.md)
        self._pins = NamespacePins(self.node, self._space)
        self._taskwork.pins = self._pins
        self._sweeper: asyncio.Task[None] | None = None
        self._stripes_back: asyncio.Task[None] | None = None
        self.preparations = Preparations(  # docs/design.md#next-job-preparation
            service_parts(
                self.node,
                self._space,
                submit_task=self.submit_task,
                get_task=self.get_task,
                release_task=self.release_task,
            )
        )
        self._taskwork.preparations = self.preparations
        self.started = False
        # told to stop: its stripe shares handed to their new owners first (docs/design-striping.md#churn)
        self.handoff = StripeHandoff(settings, self.stripes, clock, hooks.node_leaving)

    async def _capacity(self) -> int:
        """The cache's capacity in bytes (``DSAGENT_CAPACITY``, else the disk's less its floor)."""
        return int((await self._space.report())["capacityBytes"])

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
            self.link_choice = await self.pools.work(choose_links, self.settings)
            self.links.addresses = self.link_choice.addresses
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="dsagent-sweep")
        self._stripes_back = asyncio.create_task(self.stripes.recover(), name="dsagent-stripes")
        for task_id, request, digest in await recovery.interrupted(self.pools, self.catalog, now=self.clock()):
            try:  # the operator may have narrowed the allowlist since the request was taken
                await self.pools.check(check_locations, request, policy=self.settings.source_policy)
            except DsagentError as exc:
                log.warning("not resuming %s for task %s: %s", request.name, task_id, exc)
                self._taskwork.errors[(task_id, request.name)] = exc
                continue
            self._taskwork.resume(task_id, request, digest)
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
                *self._taskwork.all_running(),
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
        the task acts for (docs/operator-guide/tenancy.md): a new task is admitted only when
        its datasets fit in what is left of the namespace's share of the cache, and reserves
        it (:mod:`dsagent.cache.namespacepins`; else :class:`NamespaceShareExceeded`, before
        any work), and the namespace is recorded as one that asked for each dataset's source.

        The route, step by step: the request checked (:meth:`_checked`); admitted (cluster
        mode's task guard, not while stopping, within the namespace's share); recorded (a new
        task, or the same request renewed); each dataset's work started
        (:meth:`dsagent.cache.taskwork.TaskWork.start_task`, which carries it to ready); the
        task's record answered (:meth:`_record`)."""
        try:
            task_id, requests = await self._checked(task_id, datasets)
        except DsagentError as exc:  # refused before any work: still a failed request
            for _ in datasets or (None,):
                self.metrics.request_settled(exc.code)
            raise
        now = self.clock()
        admit_task = self.hooks.admit_task
        pinning = tenant is not None and self._pins.enforced
        new = (admit_task is not None or pinning) and await self._db(self.catalog.task, task_id) is None
        if admit_task is not None and new:
            # Admission may wait (e.g. for the pod watch to see the pod): do it before the
            # lock so it never holds up other tasks' requests.
            await admit_task(task_id)
        # the sizes the bundle stores declare: read before the lock, as the checks above
        declared = await self._pins.declared_sizes(requests) if pinning and new else {}
        async with self._submit_lock:  # the same task id sent twice at once is still one task
            existing = await self._db(self.catalog.task, task_id)
            if existing is None:
                self._admit(requests)
                if tenant is not None:  # checked and reserved at once: tasks sent together count together
                    await self._pins.admit(task_id, tenant, requests, declared, now)
                try:
                    await self._db(
                        self.catalog.create_task,
                        task_id,
                        [r.redacted() for r in requests],
                        now=now,
                        lease_until=now + self.settings.lease_ttl,
                    )
                except BaseException:
                    self._pins.drop(task_id)
                    raise
                bound: Mapping[str, str | None] = {}
            else:
                check_same_request(existing, requests)
                await self._db(self.catalog.renew_task, task_id, now + self.settings.lease_ttl)
                await self._db(self.catalog.touch_task, task_id, now)
                bound = existing.digests
            if tenant is not None:
                await self._db(self.catalog.record_tenant, task_id, tenant, [(r.name, r.source) for r in requests])
            await self._taskwork.start_task(task_id, requests, bound)
        if wait:
            await self._taskwork.wait(task_id, wait)
        return await self._record(task_id)

    async def renew_task(self, task_id: str) -> None:
        """Extend the task's lease by ``lease_ttl`` from now, as a repeated request would,
        without checking or starting anything (NotFound once it is released)."""
        task_id = task_key(task_id)
        now = self.clock()
        if await self._db(self.catalog.task, task_id) is None:
            raise NotFound(f"no task {task_id!r} on this agent")
        await self._db(self.catalog.renew_task, task_id, now + self.settings.lease_ttl)
        await self._db(self.catalog.touch_task, task_id, now)

    async def retry_failed(self, task_id: str, datasets: Sequence[DatasetRequest]) -> None:
        """Start again the datasets of the task that failed, with ``datasets`` (the task's
        own request: the same names, sources and stores; its storage options, which the
        agent keeps in memory only, given again). The others are left as they are."""
        task_id, requests = await self._checked(task_id, datasets)
        async with self._submit_lock:
            existing = await self._db(self.catalog.task, task_id)
            if existing is None:
                raise NotFound(f"no task {task_id!r} on this agent")
            check_same_request(existing, requests)
            for request in requests:  # the failed ones only: no hand-over, that was the first submit's
                if (task_id, request.name) in self._taskwork.errors:
                    await self._taskwork.start(task_id, request, existing.digests.get(request.name))

    async def task_settled(self, timeout: float) -> None:
        """Until some dataset of some task settles (ready or failed), at most ``timeout``
        seconds: a caller that follows a task's state (the CSI node plugin) waits here
        instead of polling."""
        await self._taskwork.changed(timeout)

    def _admit(self, requests: Sequence[DatasetRequest]) -> None:
        """A new task is refused while this agent stops (its stripe hand-off runs)."""
        if self.handoff.stopping:
            for _ in requests:
                self.metrics.request_settled(AgentStopping.code)
            raise AgentStopping(
                "this agent is stopping: it takes no new task",
                hint="ask again once the agent that replaces it serves (or on another node)",
            )

    async def tenant_pinned(self, tenant: str) -> int:
        """Bytes the live tasks acting for ``tenant`` hold on this node."""
        return int(await self._db(self.catalog.tenant_pinned, tenant, self.clock()))

    async def _checked(self, task_id: str, datasets: Sequence[DatasetRequest]) -> tuple[str, list[DatasetRequest]]:
        """The task's one form and its requests, each location on the operator's allowlist."""
        key = validate_request(task_id, datasets)
        for request in datasets:  # resolving a location may touch the network: off the loop
            await self.pools.check(check_locations, request, policy=self.settings.source_policy)
        return key, list(datasets)

    async def get_task(self, task_id: str, *, wait: float = 0.0) -> TaskRecord:
        """Where the task stands, dataset by dataset; NotFound when there is no such task.
        With ``wait``, first wait up to that many seconds for the task's running work to
        end (as :meth:`submit_task` does): a client following a task learns that it is
        ready when it is, not at its next poll."""
        task_id = task_key(task_id)
        if wait:  # an unknown task has no work: NotFound at once
            await self._taskwork.wait(task_id, wait)
        return await self._record(task_id)

    async def _record(self, task_id: str) -> TaskRecord:
        task = await self._db(self.catalog.task, task_id)
        if task is None:
            raise NotFound(
                f"no task {task_id!r} on this agent", hint="submit it with PUT /v1/tasks/{task} or dsctl cache"
            )
        statuses = [await self._dataset_status(task, item) for item in task.request]
        namespace = await self._db(self.catalog.tenant_of, task_id)
        return TaskRecord(task.task_id, task.created_at, task.lease_until, tuple(statuses), namespace)

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
        return report.dataset_status(
            item,
            digest,
            row,
            error=self._taskwork.errors.get((task.task_id, name)),
            waiting=self._taskwork.working(task.task_id, name),
            fetching=row is not None and self._flights.is_fetching((name, row.digest)),
            pending=self._progress.pending(name, item["source"]),
            progress=self._progress.get((name, row.digest)) if row else None,
            path=str(self.store.ready_dir(name, row.digest)) if row else None,
            checking=(task.task_id, name) in self._taskwork.checking,
        )

    async def task_ids(self) -> list[str]:
        """The ids of every task this agent holds, oldest first (released ones are gone)."""
        return await self._db(self.catalog.task_ids)

    async def release_task(self, task_id: str) -> None:
        """The task no longer needs its datasets (the pod ended); they become evictable."""
        task_id = task_key(task_id)
        self._taskwork.cancel(task_id)
        self._claims.release(task_id)
        self._pins.drop(task_id)
        await self._db(self.catalog.touch_task, task_id, self.clock())  # idle time counts from here
        if not await self._db(self.catalog.delete_task, task_id):
            raise NotFound(f"no task {task_id!r} on this agent")
        self.preparations.wake()  # a prepared task the start rule holds may start now
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
        task_id, requests = await self._checked(task_id, datasets)
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
        working = self._taskwork.busy_datasets()
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
        tasks = await self._db(self.catalog.task_ids)
        states = report.task_states(tasks, failed=self._taskwork.failed_tasks(), working=self._taskwork.busy_tasks())
        self.metrics.set_gauges(await self.space(), (v["state"] for v in await self.datasets()), states)
        return self.metrics.render()


__all__ = ["CacheService", "DatasetRequest", "DatasetStatus", "EvictionResult", "TaskRecord", "iso", "redact_url"]
