"""The Dataset controller's reconcile loop: each resync, the leader reads the Nodes' inventories
and every ``Dataset``, and hands each concern its part (the package docstring,
:mod:`dsagent.controller`, says what each owns).

Who runs it: ``python -m dsagent.controller`` (:func:`main`); tests build
:class:`DatasetController` over the fake API server and call :meth:`~DatasetController.reconcile_all`.

Per Dataset, each pass: ``status.readyNodes`` / ``status.readyNodeCount`` (the nodes whose
inventory, the Node annotation ``dsagent.io/inventory`` each agent publishes, holds the
current digest ``status.digest`` ready; inventories are hostile input: one that is not JSON
or not an object is skipped, never trusted), then packing, warm-up, preparation, replicas
and cleanup; the status patch is written only when it changes anything. Once per pass: the
copy counts, next-job preparation, store gc and migration, each an optimisation that never
stops a pass when it fails.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from dsagent.cache import replication
from dsagent.cluster.datasets import GROUP, MERGE_PATCH, PLURAL, VERSION
from dsagent.controller import agents
from dsagent.controller.agents import JSON, AgentCall
from dsagent.controller.controllermetrics import ControllerMetrics, serve_metrics
from dsagent.controller.controllersettings import ControllerSettings
from dsagent.controller.copycounts import publish_copies
from dsagent.controller.leader import LeaseElector
from dsagent.controller.migration import MigrationPass
from dsagent.controller.nextjob import prepare_pass
from dsagent.controller.packing import Fingerprint, PackJobs, listing_fingerprint
from dsagent.controller.storegc import StoreCollector
from dsagent.controller.warmup import replicas_status, warm_status
from dsplatform import published
from dsplatform.errors import exit_on_error

log = logging.getLogger("dsagent.controller")

INVENTORY_ANNOTATION = published.INVENTORY
CLEANUP_ANNOTATION = "dsagent.io/cleanup"


def parse_inventory(raw: Any) -> dict[str, Any] | None:
    """A Node's inventory annotation, or None when it is not a JSON object (hostile input)."""
    if not isinstance(raw, str) or len(raw) > 1 << 20:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("datasets", {}), dict) else None


def ready_nodes(inventories: Mapping[str, Mapping[str, Any]], name: str, digest: str | None) -> list[str]:
    """Nodes whose inventory holds ``name`` at ``digest`` ready (any listed version counts)."""
    if not digest:
        return []
    out = []
    for node, inv in inventories.items():
        entry = inv.get("datasets", {}).get(name)
        if not isinstance(entry, dict):
            continue
        versions = [entry] + [v for v in entry.get("versions") or [] if isinstance(v, dict)]
        if any(v.get("digest") == digest and v.get("state") == "ready" for v in versions):
            out.append(node)
    return sorted(out)


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
            api_client, namespace=settings.namespace, name=settings.lease_name, identity=settings.identity, clock=clock
        )
        self.agent_call: AgentCall = agent_call if agent_call is not None else self._http_agent_call
        self._agent_urls: dict[str, str] = {}
        # (namespace, name) -> status.preparation this pass; None: the pass failed (keep status)
        self._preparation: dict[tuple[str, str], JSON] | None = {}
        self._nodes_now: list[JSON] = []
        self._pods_now: list[JSON] | None = None
        self.metrics = ControllerMetrics()
        self.packs = PackJobs(
            self._batch,
            namespace=settings.namespace,
            image=settings.pack_image,
            service_account=settings.pack_service_account,
            clock=clock,
            fingerprint=fingerprint,
            created=self.metrics.pack_jobs.inc,
        )
        self.migration = MigrationPass(
            api_client, gpu_resource=settings.gpu_resource, class_prefix=settings.class_prefix, clock=clock
        )
        self.store_gc = (
            StoreCollector(
                self._batch,
                namespace=settings.namespace,
                image=settings.pack_image,
                service_account=settings.pack_service_account,
                interval_s=settings.store_gc_s,
                grace_s=settings.store_gc_grace_s,
            )
            if settings.store_gc_s
            else None
        )

    # -- the loop ------------------------------------------------------------------------

    def run_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                leading = self.elector.try_acquire()
                self.metrics.leader.set(1 if leading else 0)
                if leading:
                    self.reconcile_all()
                    self.metrics.passes.labels(result="ok").inc()
            except Exception:  # one bad pass must not end the controller
                self.metrics.passes.labels(result="error").inc()
                log.exception("reconcile pass failed; retrying at the next resync")
            self.metrics.pass_seconds.observe(time.monotonic() - started)
            time.sleep(max(0.0, self.settings.resync_s - (time.monotonic() - started)))

    def reconcile_all(self) -> None:
        nodes = agents.raw(self._core.list_node)["items"]
        inventories = {}
        for node in nodes:
            meta = node.get("metadata") or {}
            inv = parse_inventory((meta.get("annotations") or {}).get(INVENTORY_ANNOTATION))
            if inv is not None:
                inventories[meta.get("name", "")] = inv
        s = self.settings
        self._agent_urls = agents.find_agents(self._core, s.namespace, s.agent_selector, s.agent_port)
        try:
            publish_copies(
                self._core,
                inventories,
                configmap=s.copies_configmap,
                namespace=s.namespace,
                now=self.clock(),
                metrics=self.metrics,
            )
        except Exception:  # counts are an optimisation: never let them stop a pass
            log.exception("publishing the copy counts failed; agents fall back to LRU once theirs are stale")
        datasets = agents.raw(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)["items"]
        self._preparation = {}
        self._nodes_now = nodes
        self._pods_now = None  # listed at most once per pass, when something needs them
        if s.prepare is not None:
            try:
                self._preparation = prepare_pass(
                    nodes,
                    inventories,
                    datasets,
                    s.prepare,
                    pods=self._pods(),
                    now=self.clock,
                    agent_call=self.agent_call,
                    metrics=self.metrics,
                )
            except Exception:  # preparation is an optimisation: never let it stop a pass
                log.exception("next-job preparation failed this pass")
                self._preparation = None
        reconciled = []  # the Datasets as this pass left them (a pack Job started now is Running)
        for ds in datasets:
            try:
                patch = self.reconcile(ds, nodes, inventories)
                reconciled.append({**ds, "status": {**(ds.get("status") or {}), **patch}})
                self.metrics.datasets.labels(result="ok").inc()
            except Exception:
                self.metrics.datasets.labels(result="error").inc()
                meta = ds.get("metadata") or {}
                log.exception("reconciling Dataset %s/%s failed", meta.get("namespace"), meta.get("name"))
        if self.store_gc is not None and len(reconciled) == len(datasets):  # a failed one may be packing
            try:
                self.store_gc.run(reconciled, self.clock())
            except Exception:  # gc is housekeeping: never let it stop a pass
                log.exception("starting store gc Jobs failed this pass")
        if s.migrate:
            try:
                self.migration.run(nodes, self._pods())
            except Exception:  # a move is an optimisation: never let it stop a pass
                log.exception("migration failed this pass")

    def reconcile(self, ds: JSON, nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]]) -> JSON:
        """One Dataset: the status patch it needs (also written, when it changes anything)."""
        meta, spec = ds.get("metadata") or {}, ds.get("spec") or {}
        status = ds.get("status") or {}
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        ready = ready_nodes(inventories, name, status.get("digest"))
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
                agent_call=self.agent_call,
                agent_nodes=set(self._agent_urls),
                now=self.clock(),
            )
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
                agent_call=self.agent_call,
                agent_nodes=set(self._agent_urls),
                nodes=self._nodes_now,
                pods=self._pods,
                now=self.clock,
                window_s=self.settings.replicas_window_s,
                max_auto=self.settings.replicas_max,
            )
        request = (meta.get("annotations") or {}).get(CLEANUP_ANNOTATION)
        if isinstance(request, str) and request and request[:253] != (status.get("cleanup") or {}).get("request"):
            patch["cleanup"] = agents.cleanup(
                self.agent_call, sorted(self._agent_urls), name, request[:253], self.clock()
            )
        changed = {k: v for k, v in patch.items() if status.get(k) != v}
        if changed:
            self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": changed}, _content_type=MERGE_PATCH
            )
        return patch

    def _pods(self) -> list[JSON]:
        if self._pods_now is None:
            self._pods_now = agents.raw(self._core.list_pod_for_all_namespaces)["items"]
        return self._pods_now

    def _http_agent_call(self, node: str, method: str, path: str, body: JSON | None) -> tuple[int, Any] | None:
        return agents.http_call(self._agent_urls.get(node), self.settings.admin_token, node, method, path, body)


def main() -> None:  # pragma: no cover - the container's entry point
    from dsagent.cache.settings import AgentLogSettings
    from dsplatform import logs

    with exit_on_error("dsagent controller"):  # bad settings, no API server: one line and its exit code
        from dsagent.cluster.envnames import refuse_unknown

        refuse_unknown()
        log_settings = AgentLogSettings.from_env()  # DSAGENT_LOG_LEVEL, _LOG_FORMAT (docs/design.md#logs)
        # only once the settings are good: configure() replaces the root logger's handlers
        logs.configure(log_settings.log_level, log_settings.log_format)
        _run_controller()


def _run_controller() -> None:
    from dsagent.cluster import apiclient

    settings = ControllerSettings.from_env()
    log.info(
        "Dataset controller %s starting (lease %s/%s, resync %.0f s)",
        settings.identity,
        settings.namespace,
        settings.lease_name,
        settings.resync_s,
    )
    controller = DatasetController(apiclient.load(), settings)
    if settings.metrics_port:
        serve_metrics(settings.metrics_port, controller.metrics.registry)
    controller.run_forever()


__all__ = ["CLEANUP_ANNOTATION", "INVENTORY_ANNOTATION", "DatasetController", "main", "parse_inventory", "ready_nodes"]
