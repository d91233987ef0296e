"""The Dataset controller's reconcile loop: each resync, the leader reads the Nodes' inventories
and every ``Dataset``, and hands each concern its part (the package docstring,
:mod:`dsagent.controller`, says what each owns).

Who runs it: ``python -m dsagent.controller`` (:func:`dsagent.controller.process.main`); tests build
:class:`DatasetController` over the fake API server and call :meth:`~DatasetController.reconcile_all`.

Per Dataset, each pass: ``status.readyNodes`` / ``status.readyNodeCount`` (the nodes whose
inventory, in the ``NodeCache`` each agent publishes, holds the current digest
``status.digest`` ready; a node without a ``NodeCache`` is read from its Node annotation
``dsagent.io/inventory``, which an agent of the release before writes:
:meth:`DatasetController.list_nodes`; inventories are hostile input: one that is not JSON or
not an object is skipped, never trusted), then packing, warm-up, preparation, replicas
and cleanup; the status patch is written only when it changes anything. Once per pass: the
copy counts, next-job preparation, store gc and migration, each an optimisation that never
stops a pass when it fails; then what the agents still hold for a Dataset deleted since
(:mod:`dsagent.controller.orphans`) is released (every agent is asked after a Dataset went,
a few in turn otherwise).

What a pass reads, once: the Nodes with their ``NodeCache`` (kept by list+watch,
:mod:`dsagent.kube.nodewatch`), the Datasets, and the agents (found among every pod when
the pass lists them anyway, else asked for by their selector); each inventory's text is
parsed once and indexed by the datasets it lists from pass to pass
(:mod:`dsagent.controller.inventories`); the collector is kept off what was read (:mod:`.passheap`).

Tenancy (docs/operator-guide/tenancy.md): a node inventory older than ``inventory_max_age`` (by its
``publishedAt``) is used for nothing; each pass keeps one
:class:`~dsagent.controller.quotas.Ledger` of what each namespace pins; a spec field a bound
held back is the Dataset's ``Refused`` condition and a Warning Event. Faults: every API
request is bounded (``api_timeout_s``) and after a failed pass the loop backs off
(:meth:`DatasetController.step`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from dsagent.controller import agents, cachestate, podfacts
from dsagent.controller.agents import FROM_CACHE, JSON, AgentCall, PassCalls
from dsagent.controller.controllermetrics import ControllerMetrics
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.copycounts import publish_copies
from dsagent.controller.inventories import DatasetIndex, InventoryReader, parse_inventory
from dsagent.controller.jobpod import JobPlace
from dsagent.controller.leader import LeaseElector
from dsagent.controller.migration import MigrationPass
from dsagent.controller.nextjob import pods_to_prepare, prepare_pass
from dsagent.controller.orphans import GoneSweep
from dsagent.controller.packing import Fingerprint, PackJobs, listing_fingerprint
from dsagent.controller.passheap import PassHeap
from dsagent.controller.passpods import PassPods
from dsagent.controller.plangates import PlanGates
from dsagent.controller.queues import list_queues
from dsagent.controller.quotas import Ledger, Limits, Refusal
from dsagent.controller.refusals import refused_condition
from dsagent.controller.statuswrites import StatusWrites
from dsagent.controller.storegc import StoreCollector
from dsagent.controller.striping import (
    StripedPass,
    draining,
    job_nodes,
    node_subnets,
    parse_stripe,
    share_renewals,
    stripe_status,
    striped_pass,
)
from dsagent.controller.warmup import WarmRanking, renewals, replica_rooms, replicas_status, warm_status
from dsagent.kube import nodestate, nodewatch, podswatch
from dsagent.kube.datasets import GROUP, PLURAL, VERSION
from dsagent.kube.events import EventRecorder, ObjectRef
from dsagent.policy import copies, replication
from dsagent.policy.preparation import Thresholds
from dsplatform import published
from dsplatform.kubetime import format_time
from dsplatform.tenancy import acting_for

log = logging.getLogger("dsagent.controller")

INVENTORY_ANNOTATION = published.INVENTORY
CLEANUP_ANNOTATION = "dsagent.io/cleanup"
EVENTS_CONTROLLER = "dsagent.io/dataset-controller"  # the reportingController of its Events
STRIPE_INVALID = "StripeInvalid"  # the Refused reason of a spec.stripe the controller cannot act on
#: the backoff after failed passes stops growing here (or at the resync, when that is longer)
BACKOFF_MAX_S = 300.0


class DatasetController:
    """Reconciles Datasets; :meth:`run_forever` for the process, :meth:`reconcile_all` in tests."""

    def __init__(
        self,
        api_client: Any,
        settings: ControllerSettings,
        *,
        clock: Callable[[], float] = time.time,
        agent_call: AgentCall | None = None,
        fingerprint: Fingerprint = listing_fingerprint,
    ) -> None:
        from kubernetes.client import BatchV1Api, CoreV1Api, CustomObjectsApi

        self.settings, self.clock = settings, clock
        self._core: Any = CoreV1Api(api_client)
        self._batch: Any = BatchV1Api(api_client)
        self._custom: Any = CustomObjectsApi(api_client)
        self.elector = LeaseElector(
            api_client,
            namespace=settings.namespace,
            name=settings.lease_name,
            identity=settings.identity,
            clock=clock,
            request_timeout=settings.api_timeout_s,
        )
        watch = (
            nodewatch.NodeWatch(api_client, request_timeout=settings.api_timeout_s) if settings.watch_nodes else None
        )
        self.node_watch = watch  # started by the process (:func:`main`), not by a test's controller
        self._agents_http = agents.AgentHttp()  # one client for every agent call (made on first use)
        self.agent_call: AgentCall = agent_call if agent_call is not None else self._http_agent_call
        self._calls: AgentCall = self.agent_call  # a pass's: its renewals sent first (agents.PassCalls)
        self._agent_urls: dict[str, str] = {}
        self._copies: copies.Tally | None = None  # the copy counts and keepers of the pass
        self._striped: StripedPass | None = None  # made once a pass, for its first striped Dataset
        # (namespace, name) -> status.preparation this pass; None: the pass failed (keep status)
        self._preparation: dict[tuple[str, str], JSON] | None = {}
        self._nodes_now: list[JSON] = []
        # the inventories' texts parsed and what was read from each, kept from pass to pass
        self._reader = InventoryReader()
        self.heap = PassHeap()  # the cyclic garbage collector kept off what a pass read
        # built once a pass, not per Dataset: the inventories by the datasets they list, and
        # the nodes' free GPUs
        self._by_dataset: DatasetIndex | None = None
        self._gpus_now: dict[str, int] | None = None
        # likewise, at most once a pass and only when a Dataset asks for copies: the agent
        # nodes ranked for warm-up and for replicas
        self._warm_ranking: WarmRanking | None = None
        self._replica_rooms: replication.Ranked | None = None
        self.metrics = ControllerMetrics()
        pods_watch = (
            podswatch.PodsWatch(api_client, request_timeout=settings.api_timeout_s) if settings.watch_pods else None
        )
        # every pod, read at most once a pass (watched once a pass has read them)
        self.pods = PassPods(self._core, settings.api_timeout_s, pods_watch, self.metrics.pod_reads)
        self._failures = 0  # failed passes in a row (the backoff)
        self.gone_sweep = GoneSweep()  # which agents a pass asks what they hold for gone Datasets
        self._timeout = settings.api_timeout_s
        self.events = EventRecorder(api_client, controller=EVENTS_CONTROLLER, instance=settings.identity, clock=clock)
        self.status_writes = StatusWrites(self._custom, timeout=self._timeout)
        self.limits = Limits(
            warm_nodes=settings.warm_nodes_max,
            replicas=settings.replicas_max,
            node_share=settings.namespace_share,
            cluster_bytes=settings.namespace_bytes,
            open_tasks=settings.namespace_tasks,
        )
        self._ledger = Ledger(self.limits, {})
        jobs = JobPlace(settings.namespace, settings.pack_image, settings.pack_service_account)
        self.packs = PackJobs(
            self._batch,
            jobs,
            clock=clock,
            fingerprint=fingerprint,
            created=self.metrics.pack_jobs.inc,
        )
        self.migration = MigrationPass(
            api_client, gpu_resource=settings.gpu_resource, class_prefix=settings.class_prefix, clock=clock
        )
        self.plan_gates = PlanGates.of(api_client, settings, self.events, clock) if settings.plan_gates else None
        self.store_gc = (
            StoreCollector(self._batch, jobs, interval_s=settings.store_gc_s, grace_s=settings.store_gc_grace_s)
            if settings.store_gc_s
            else None
        )

    # -- the loop ------------------------------------------------------------------------

    def run_forever(self) -> None:
        while True:
            started = time.monotonic()
            delay = self.step()
            time.sleep(max(0.0, delay - (time.monotonic() - started)))

    def step(self) -> float:
        """One pass (when this replica leads); the seconds until the next. After a failed pass
        (the Lease unreachable counts) the wait doubles (twice the resync, then four times, ...
        up to :data:`BACKOFF_MAX_S`), so a failing API server is not hammered; the first good
        pass brings back the resync. Each API request is bounded by ``api_timeout_s``, so a
        hanging API server holds a pass no longer than that (docs/operator-guide/tenancy.md)."""
        started = time.monotonic()
        resync = self.settings.resync_s
        try:
            leading = self.elector.try_acquire()
            self.metrics.leader.set(1 if leading else 0)
            if not leading:  # what goes while another replica leads is not seen here: its next pass asks every agent
                self.gone_sweep.forget()
            if leading:
                self.reconcile_all()
                self.metrics.passes.labels(result="ok").inc()
            elif self.elector.failed:
                raise RuntimeError("the Lease could not be read or written")
            self._failures = 0
        except Exception:  # one bad pass must not end the controller
            self.metrics.passes.labels(result="error").inc()
            self._failures += 1
            self.gone_sweep.forget()  # the Lease may have gone to another replica meanwhile
            log.exception("reconcile pass failed (%d in a row); backing off", self._failures)
        finally:
            self.metrics.pass_seconds.observe(time.monotonic() - started)
        if self._failures == 0:
            return float(resync)
        return float(min(max(resync, BACKOFF_MAX_S), resync * 2**self._failures))

    def fresh_inventories(self, nodes: list[JSON]) -> dict[str, dict[str, Any]]:
        """node -> its inventory, for the nodes whose inventory parses and is not stale (its
        ``dsagent.io/published-at`` within ``inventory_max_age``): nothing is decided on an
        older one (docs/operator-guide/tenancy.md)."""
        return self._reader.fresh(nodes, self.clock(), self.settings.inventory_max_age)

    def list_nodes(self) -> list[JSON]:
        """The Nodes with their ``NodeCache`` overlaid: :attr:`node_watch`'s, else listed now."""
        list_all = partial(
            nodestate.list_nodes, self._core, self._custom, timeout=self._timeout, resource_version=FROM_CACHE
        )
        return nodewatch.current(self.node_watch, list_all, reads=self.metrics.node_reads)

    def reconcile_all(self) -> None:
        """One pass; the collector kept off what it read (:mod:`dsagent.controller.passheap`);
        the Event series counted since their last write written where due
        (:meth:`dsagent.kube.events.EventRecorder.flush`)."""
        self.events.begin()  # written on threads during the pass, all of them before it ends
        try:
            self._pass()
        finally:
            self.events.settle()
            self.heap.settle()
        self.events.flush()

    def _pass(self) -> None:
        # the last pass's lists go before this pass's are read: never both held at once (the
        # process's peak, and what each of the interpreter's full collections walks)
        self._nodes_now, self._gpus_now, self._by_dataset, self._copies = [], None, None, None
        self.pods.next_pass()
        self._forget_rankings()
        self._reader.next_pass()
        self.heap.reading()  # from here to the index: API reads and JSON, no reference cycle
        nodes = self.list_nodes()
        inventories = self.fresh_inventories(nodes)
        self._ledger = Ledger(self.limits, {node: _capacity(inv) for node, inv in inventories.items()})
        s = self.settings
        self._copies = None
        try:
            # the copy counts, once a pass
            self._copies = copies.tally(inventories, ready=self._reader.held_copies, keeper_of=self._reader.keeper)
            publish_copies(
                self._core,
                self._copies,
                configmap=s.copies_configmap,
                namespace=s.namespace,
                now=self.clock(),
                metrics=self.metrics,
            )
        except Exception:  # counts are an optimisation: never let them stop a pass
            log.exception("publishing the copy counts failed; agents fall back to LRU once theirs are stale")
        datasets = agents.raw(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, timeout=self._timeout)[
            "items"
        ]
        keys = _keys(datasets)
        self.gone_sweep.listed(keys)  # before any agent is asked to hold anything for them
        self._preparation = {}
        self._nodes_now = nodes
        self._agent_urls = self._find_agents(datasets)
        self._by_dataset = self._reader.index(inventories)
        self.heap.read()
        if s.prepare is not None:
            self._preparation = self._prepare(s.prepare, nodes, inventories, datasets)
        reconciled = []  # the Datasets as this pass left them (a pack Job started now is Running)
        self.status_writes.begin()  # written on threads meanwhile, all of them before the pass goes on
        calls = PassCalls(self.agent_call)
        try:
            calls.send(
                [
                    *renewals(datasets, self._agent_urls, self.clock()),
                    *share_renewals(datasets, inventories, self._agent_urls),
                ]
            )
        except Exception:  # sending them first is an optimisation: each Dataset still asks its own
            log.exception("sending the pass's renewals together failed; each Dataset asks its agents in turn")
        self._calls = calls
        try:
            for ds in datasets:
                try:
                    patch = self.reconcile(ds, nodes, inventories)
                    reconciled.append({**ds, "status": {**(ds.get("status") or {}), **patch}})
                except Exception:
                    self.metrics.datasets.labels(result="error").inc()
                    meta = ds.get("metadata") or {}
                    log.exception("reconciling Dataset %s/%s failed", meta.get("namespace"), meta.get("name"))
        finally:
            self._calls = self.agent_call
        unwritten = self.status_writes.settle()
        for (namespace, name), error in unwritten.items():
            log.error("writing the status of Dataset %s/%s failed", namespace, name, exc_info=error)
        reconciled = [ds for ds in reconciled if _key(ds) not in unwritten]
        self.metrics.datasets.labels(result="ok").inc(len(reconciled))
        self.metrics.datasets.labels(result="error").inc(len(unwritten))
        try:  # what agents still hold for Datasets deleted since: released now, not at their lease's end
            self.gone_sweep.run(self.agent_call, set(self._agent_urls), keys, metrics=self.metrics)
        except Exception:  # housekeeping: never let it stop a pass
            log.exception("releasing what agents hold for deleted Datasets failed this pass")
        if self.store_gc is not None and len(reconciled) == len(datasets):  # a failed one may be packing
            try:
                self.store_gc.run(reconciled, self.clock())
            except Exception:  # gc is housekeeping: never let it stop a pass
                log.exception("starting store gc Jobs failed this pass")
        if s.migrate:
            try:
                self.migration.run(nodes, self.pods.all())
            except Exception:  # a move is an optimisation: never let it stop a pass
                log.exception("migration failed this pass")
        if self.plan_gates is not None:  # after migration, as the design's round (6.2)
            try:
                self.plan_gates.run(nodes, self.pods.all)
            except Exception:  # the next pass tries again
                log.exception("the plan loop failed this pass")

    def reconcile(self, ds: JSON, nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]]) -> JSON:
        """One Dataset: the status patch it needs (also written, when it changes anything)."""
        meta, spec = ds.get("metadata") or {}, ds.get("spec") or {}
        status = ds.get("status") or {}
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        refusals: list[Refusal] = []
        size = _size_of(status.get("bytes"))
        digest = status.get("digest") if isinstance(status.get("digest"), str) else None
        indexed = self._by_dataset
        if indexed is None or indexed.inventories is not inventories:  # called on its own (tests), not by a pass
            indexed = self._by_dataset = self._reader.index(inventories)
            self._forget_rankings()
        # the one walk of the inventories for it: those that list it
        held = indexed.holdings(name, digest)
        ready = sorted(node for node, holding in held.items() if holding.state == "ready")
        patch: JSON = {"readyNodes": ready, "readyNodeCount": len(ready)}
        pack: JSON = spec["pack"] if isinstance(spec.get("pack"), dict) else {}
        if pack.get("auto") is True and isinstance(spec.get("source"), str) and isinstance(spec.get("bundles"), str):
            patch["pack"] = self.packs.status(namespace, name, spec, pack, status.get("pack") or {})
        warm = spec.get("warm") if isinstance(spec.get("warm"), dict) else None
        previous = status.get("warm") or {}
        if warm is not None or previous.get("nodes"):
            patch["warm"] = warm_status(
                namespace,
                name,
                spec,
                warm,
                previous,
                nodes,
                inventories,
                agent_call=self._calls,
                agent_nodes=set(self._agent_urls),
                now=self.clock(),
                max_nodes=self.limits.warm_nodes,
                admit=(warm_admit := self._ledger.admitter(namespace, size)),
                refusals=refusals,
                ranking=lambda: self._warm_nodes(nodes, inventories),
                listing=indexed.listing(name),
            )
            if warm_admit.refused is not None:
                refusals.append(warm_admit.refused)
        prepared = self._preparation.get((namespace, name)) if self._preparation is not None else None
        if prepared is not None or (self._preparation is not None and status.get("preparation")):
            patch["preparation"] = prepared or {"reservedBytes": 0, "fetchingBytes": 0, "pods": []}
        mode = replication.parse_mode(spec.get("replicas"))
        if mode is not None or (status.get("replicas") or {}).get("nodes"):
            patch["replicas"] = replicas_status(
                namespace,
                name,
                spec,
                status,
                mode,
                ready,
                inventories,
                agent_call=self._calls,
                agent_nodes=set(self._agent_urls),
                nodes=self._nodes_now,
                pods=self.pods.all,
                gpus=self._free_gpus,
                now=self.clock,
                window_s=self.settings.replicas_window_s,
                max_auto=self.settings.replicas_max,
                admit=(copies_admit := self._ledger.admitter(namespace, size)),
                refusals=refusals,
                ranked=lambda: self._rooms(inventories),
                pods_by_dataset=self.pods.by_dataset,
            )
            if copies_admit.refused is not None:
                refusals.append(copies_admit.refused)
        if spec.get("stripe") is not None and parse_stripe(spec.get("stripe")) is None:
            # a spec from before the CRD typed it (the API server refuses it now): said, not ignored
            refusals.append(
                Refusal(
                    STRIPE_INVALID,
                    f'spec.stripe {str(spec.get("stripe"))[:100]!r} is neither "auto" nor {{members: N}} with N'
                    " from 1 to 4096: the version is not striped (docs/user-guide/striping.md)",
                )
            )
        if parse_stripe(spec.get("stripe")) is not None or (status.get("stripe") or {}).get("nodes"):
            stripe_events: list[tuple[str, str, str]] = []
            patch["stripe"] = stripe_status(
                name,
                spec,
                status,
                inventories,
                agent_call=self._calls,
                agent_urls=self._agent_urls,
                who=acting_for(namespace, name),
                job=job_nodes(self.pods.by_dataset().get((namespace, name), ()), namespace, name),
                now=self.clock(),
                drain_timeout=self.settings.stripe_drain_timeout_s,
                events=stripe_events,
                striped=self._striped_pass(inventories),
                listing=indexed.listing(name),
            )
            regarding = ObjectRef.of({**ds, "apiVersion": f"{GROUP}/{VERSION}", "kind": "Dataset"})
            for kind, reason, note in stripe_events:
                self.events.record(regarding, type=kind, reason=reason, action="Stripe", note=note)
        request = (meta.get("annotations") or {}).get(CLEANUP_ANNOTATION)
        if isinstance(request, str) and request and request[:253] != (status.get("cleanup") or {}).get("request"):
            patch["cleanup"] = agents.cleanup(
                self._calls, sorted(self._agent_urls), namespace, name, request[:253], self.clock()
            )
        conditions = refused_condition(ds, status, refusals, format_time(self.clock()), self.events)
        self._cache_state(ds, status, patch, conditions, held, size)
        changed = {k: v for k, v in patch.items() if status.get(k) != v}
        if changed:
            self.status_writes.write(namespace, name, changed)
        return patch

    def _cache_state(
        self,
        ds: JSON,
        status: JSON,
        patch: JSON,
        conditions: list[JSON] | None,
        held: Mapping[str, cachestate.Holding],
        size: int | None,
    ) -> None:
        """``status.phase``, ``status.cache`` and the ``Ready``/``Packing``/``Degraded`` conditions
        into ``patch``, and an Event for each change since the last pass
        (:mod:`dsagent.controller.cachestate`)."""
        meta = ds.get("metadata") or {}
        digest = status.get("digest") if isinstance(status.get("digest"), str) else None
        pack = patch.get("pack") or status.get("pack") or {}
        generation = meta.get("generation")
        state = cachestate.cache_status(
            held,
            digest=digest,
            size_bytes=size,
            pack_state=pack.get("state") if isinstance(pack, dict) else None,
            previous=status,
            generation=generation if isinstance(generation, int) else None,
            now=format_time(self.clock()),
        )
        kinds = {c["type"] for c in state["conditions"]}
        others = [
            c for c in (conditions if conditions is not None else status.get("conditions") or []) if isinstance(c, dict)
        ]
        patch["phase"], patch["cache"] = state["phase"], state["cache"]
        patch["conditions"] = state["conditions"] + [c for c in others if c.get("type") not in kinds]
        regarding = ObjectRef.of({**ds, "apiVersion": f"{GROUP}/{VERSION}", "kind": "Dataset"})
        for kind, reason, note in cachestate.changes(status, {**status, **patch}, digest):
            self.events.record(regarding, type=kind, reason=reason, action="Cache", note=note)

    def _pod_event(self, pod: Mapping[str, Any], reason: str, note: str) -> None:
        """A Normal Event on a pod (next-job preparation tells the pod's owner where and why)."""
        self.events.record(
            ObjectRef.of({**pod, "apiVersion": "v1", "kind": "Pod"}),
            type="Normal",
            reason=reason,
            action="Prepare",
            note=note,
        )

    def _find_agents(self, datasets: list[JSON]) -> dict[str, str]:
        """node -> its agent's URL. A pass that reads every pod anyway (:func:`agents.reads_every_pod`)
        lists them now, once, and finds the agents among them (:func:`agents.agents_among`);
        otherwise, or for a selector not read here, the API server is asked for the agents."""
        s = self.settings
        every = s.prepare is not None and not s.prepare_named_only
        if agents.reads_every_pod(datasets, prepare=every, migrate=s.migrate):
            found = agents.agents_among(self.pods.all(), s.namespace, s.agent_selector, s.agent_port)
            if found is not None:
                return found
        return agents.find_agents(self._core, s.namespace, s.agent_selector, s.agent_port, self._timeout)

    def _free_gpus(self) -> dict[str, int]:
        """The nodes' free GPUs, worked out at most once a pass (:func:`podfacts.free_gpus`;
        the pods listed only when a node publishes no count of its own)."""
        if self._gpus_now is None:
            self._gpus_now = podfacts.free_gpus(self._nodes_now, self.pods.each())
        return self._gpus_now

    def _forget_rankings(self) -> None:
        self._warm_ranking = self._replica_rooms = self._striped = None

    def _warm_nodes(self, nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]]) -> WarmRanking:
        """The agent nodes in warm-up's order, ranked at most once a pass (:class:`WarmRanking`)."""
        if self._warm_ranking is None:
            self._warm_ranking = WarmRanking(nodes, inventories, set(self._agent_urls))
        return self._warm_ranking

    def _rooms(self, inventories: Mapping[str, Mapping[str, Any]]) -> replication.Ranked:
        """The agent nodes' rooms for copies, ranked at most once a pass (:func:`replica_rooms`)."""
        if self._replica_rooms is None:
            self._replica_rooms = replica_rooms(set(self._agent_urls), inventories, self._free_gpus())
        return self._replica_rooms

    def _striped_pass(self, inventories: Mapping[str, Mapping[str, Any]]) -> StripedPass:
        """What every striped Dataset's choice reads of the nodes, at most once a pass."""
        if self._striped is None:
            self._striped = striped_pass(
                inventories,
                self._agent_urls,
                node_subnets(self._nodes_now),
                draining(self._nodes_now),
                self._copies or copies.tally(inventories),
                versions_of=self._reader.ready_versions,
            )
        return self._striped

    def _prepare(
        self, presets: Thresholds, nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]], datasets: list[JSON]
    ) -> dict[tuple[str, str], JSON] | None:
        """Next-job preparation's pass (:func:`nextjob.prepare_pass`) over the pods it reads
        (:func:`nextjob.pods_to_prepare`); None when it failed."""
        named_only = self.settings.prepare_named_only
        try:
            pods = pods_to_prepare(
                nodes,
                datasets,
                named_only=named_only,
                listed=self.pods.listed,
                every_pod=self.pods.all,
                namespace_pods=lambda ns: agents.every_pod(self._core, self._timeout, namespace=ns),
            )
            if pods is None:
                return {}
            return prepare_pass(
                nodes,
                inventories,
                datasets,
                presets,
                pods=pods,
                now=self.clock,
                agent_call=self.agent_call,
                metrics=self.metrics,
                ledger=self._ledger,
                queues=None if named_only else list_queues(self._custom, timeout=self._timeout),
                pod_event=self._pod_event,
                named_only=named_only,
            )
        except Exception:  # preparation is an optimisation: never let it stop a pass
            log.exception("next-job preparation failed this pass")
            return None

    def _http_agent_call(
        self, node: str, method: str, path: str, body: JSON | None, who: str
    ) -> tuple[int, Any] | None:
        return self._agents_http(self._agent_urls.get(node), self.settings.admin_token, node, method, path, body, who)


def _size_of(value: Any) -> int:
    """A Dataset's ``status.bytes`` as a size to charge (0 when not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _keys(datasets: list[JSON]) -> set[tuple[str, str]]:
    """``(namespace, name)`` of each Dataset."""
    return {_key(d) for d in datasets}


def _key(dataset: JSON) -> tuple[str, str]:
    meta = dataset.get("metadata") or {}
    return str(meta.get("namespace", "default")), str(meta.get("name", ""))


def _capacity(inventory: Mapping[str, Any]) -> int | None:
    value = inventory.get("capacityBytes")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


__all__ = ["CLEANUP_ANNOTATION", "INVENTORY_ANNOTATION", "DatasetController", "parse_inventory"]
