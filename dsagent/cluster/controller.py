"""The Dataset controller: keeps every ``Dataset``'s status true and acts on its spec.

Who runs it: the chart's ``controller`` Deployment (``python -m dsagent.cluster.controller``,
two replicas, one leader). It is a separate Deployment rather than part of the extender
because it writes (Dataset status, Jobs, agent requests) while the extender only reads,
and because a slow object-store listing must never delay a scheduling decision.

What it owns, per Dataset, each resync (``DSAGENT_CONTROLLER_RESYNC``, 30 s):

- ``status.readyNodes`` / ``status.readyNodeCount``: the nodes whose inventory (the Node
  annotation ``dsagent.io/inventory`` each agent publishes) holds the current digest
  (``status.digest``) ready. Inventories are hostile input: one that is not JSON or not an
  object is skipped, never trusted.
- packing (``spec.pack.auto: true``, the design's rule 7): the source is listed (names,
  sizes and ETags or mtimes, no data read) and its fingerprint compared with
  ``status.pack.fingerprint``; on creation or a change a Kubernetes Job runs
  ``dsctl pack SOURCE --name NAME --to BUNDLES --publish NAMESPACE``, named after the
  fingerprint so a new leader never starts a second Job for the same listing. The Job's
  outcome lands in ``status.pack`` (``Running``, ``Succeeded`` or ``Failed`` with the
  Job's message); a failed listing is not retried until the source changes.
- warm-up (``spec.warm``: ``nodes: N`` or ``nodeSelector``, optional ``startTime``): the
  controller picks nodes (those already holding the dataset, then the most free cache
  bytes; earlier picks are kept), asks each node's agent to cache the dataset as task
  ``warm.<namespace>.<name>`` (over the agent's TCP port with the admin token, renewed each
  resync so its lease never lapses and the copy is protected from eviction), and releases
  the task on nodes no longer picked or when ``spec.warm`` goes. ``status.warm`` reports
  what the agents say: ready nodes, bytes done and wanted per node - never "complete"
  before every byte is there.
- copy counts (docs/design.md#cluster-eviction): how many nodes hold each dataset version
  ready, counted from the same inventories, written to the ConfigMap
  ``dsplatform-dataset-copies`` in the controller's namespace
  (:mod:`dsagent.cache.copies`); agents read it to keep the cluster's last copy of a
  version when they evict. One object for every agent to read, rather than every agent
  listing every Node. Rewritten each resync with its time, so an agent can tell a
  controller that stopped (stale counts are ignored: plain LRU again).
- next-job preparation (``DSAGENT_CONTROLLER_PREPARE=on``, docs/design.md#next-job-preparation):
  each resync the pending pods that name Datasets are predicted onto the nodes whose running
  pods end soonest (:mod:`dsagent.cache.preparation`, inputs from :mod:`dsagent.cluster.prepare`);
  phase 1 is a reservation in ``status.preparation`` (no node work), phase 2 asks the
  node's agent to cache the datasets as task ``prepare.<pod UID>`` (renewed each resync,
  so the copy is protected while the pod waits); a preparation the plan drops (the pod was
  bound, deleted, or is now predicted elsewhere) has its task released at once, so its data
  is an eviction candidate. The pod's own task takes over when it is bound there. The
  ledger lives in the Datasets' status, so a new leader releases what the old one asked.
- replication of hot data (``spec.replicas``: ``auto`` or a number, docs/design.md#replication):
  a target of ready copies from the demand (pending pods naming the Dataset plus those
  started within ``DSAGENT_CONTROLLER_REPLICAS_WINDOW``), held on nodes with room and free
  GPUs as task ``replica.<namespace>.<name>`` (:mod:`dsagent.cache.replication`); nodes no
  longer chosen are released when the target falls. ``status.replicas`` shows the demand,
  target and actual copies.
- cleanup (the annotation ``dsagent.io/cleanup``: any new value): every agent is asked to
  evict the dataset *without force*; an agent where a task still uses it answers 409 and
  keeps it (``status.cleanup.keptInUse``). Old versions need no command: each agent deletes
  a superseded version at its sweep once no task holds it (rule 2).
- store gc (``DSAGENT_CONTROLLER_STORE_GC``: an interval; off by default): one
  ``dsctl gc --delete`` Job per bundle store of the auto-packed Datasets and interval,
  never while a pack of that store runs (:mod:`dsagent.cluster.storegc`).
- migration, step 5 of the deadline design (``DSAGENT_CONTROLLER_MIGRATE=on``, off by
  default; docs/design.md#deadline-migration): each resync the running jobs that opted in
  (``dsagent.io/migratable: "true"``) and would end sooner on free GPUs elsewhere, their
  move paid for, have their pods evicted through the Eviction API (PodDisruptionBudgets
  honoured) for their controllers to re-create (:mod:`scheduler_plugin.migrator`). Here
  rather than in the extender because a move is decided once for the cluster, by the
  leader, while every extender replica answers kube-scheduler.

One leader: a ``coordination.k8s.io/v1`` Lease (:class:`LeaseElector`). The kubernetes
client's own ``leaderelection`` package is not used: its ``LeaseLock`` builds its API
object from the process-global configuration (no injectable ``ApiClient``, so no fake API
server), reads the wall clock in naive local time, and its loop blocks and sleeps; the
rule here is the same (take the Lease when it is free, ours, or not renewed within its
duration; write with the resourceVersion read, so two candidates never both win).
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BeforeValidator, Field, InstanceOf, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from dsagent.cache import copies, replication
from dsagent.cache.preparation import Preparation, Thresholds
from dsagent.cluster.jobpod import job_pod
from dsagent.cluster.lease import Leases, expiry, new_lease, next_transitions
from dsagent.cluster.storegc import StoreCollector
from dsagent.errors import Conflict, DsagentError, SettingsError
from dsplatform import published
from dsplatform.errors import exit_on_error
from dsplatform.gpus import CLASS_STEM, GPU_RESOURCE, RESOURCE_PREFIX
from dsplatform.kubetime import format_micro_time, parse_or_none
from dsplatform.settings import EnvSettings, Flag, InvalidSettings, not_from_env, read_secret_file
from dsplatform.units import Duration

log = logging.getLogger("dsagent.controller")

GROUP, VERSION, PLURAL = "dsagent.io", "v1alpha1", "datasets"
INVENTORY_ANNOTATION = published.INVENTORY
CLEANUP_ANNOTATION = "dsagent.io/cleanup"
MERGE_PATCH = "application/merge-patch+json"

JSON = dict[str, Any]
# (node, method, path, body) -> (HTTP status, JSON answer); None when the node has no agent
AgentCall = Callable[[str, str, str, "JSON | None"], "tuple[int, Any] | None"]


# -- leader election -----------------------------------------------------------------------


class LeaseElector:
    """One leader among the controller's replicas, by a ``coordination.k8s.io/v1`` Lease."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration_s: int = 15,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.leases = Leases(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s, self.clock = duration_s, clock

    def try_acquire(self) -> bool:
        """Take or renew the Lease; True while this replica leads.

        A 409 on create or replace means another replica wrote first: it leads, so this
        one does not (it reads the Lease again at the next resync). Any other failure
        (RBAC, the API server unreachable) is logged and this replica does not lead."""
        now = self.clock()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": format_micro_time(now),
        }
        try:
            current = self.leases.read(self.namespace, self.name)
            if current is None:
                metadata = {"name": self.name, "namespace": self.namespace}
                self.leases.create(
                    self.namespace,
                    new_lease(metadata, {**spec, "acquireTime": format_micro_time(now), "leaseTransitions": 0}),
                )
                return True
            held = current.get("spec") or {}
            holder = held.get("holderIdentity")
            until = expiry(held, self.duration_s)
            if holder not in (None, "", self.identity) and until is not None and until > now:
                return False  # someone else leads and is alive
            new_spec = dict(held, **spec)
            if holder != self.identity:
                new_spec["acquireTime"] = format_micro_time(now)
                new_spec["leaseTransitions"] = next_transitions(held)
            current["spec"] = new_spec  # metadata.resourceVersion stays: a concurrent writer gets 409
            self.leases.replace(self.namespace, current)
        except Conflict:
            log.debug("Lease %s/%s: another replica wrote first", self.namespace, self.name)
            return False
        except DsagentError as exc:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        return True


# -- source listing fingerprints -------------------------------------------------------------


def listing_fingerprint(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """A cheap fingerprint of a source: every file's path, size and ETag (or mtime), hashed.

    A listing reads no data; an object store answers it in a few requests per thousand
    objects. Any change to a file's size, ETag or mtime, or a file added or removed, changes it."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    found = fs.find(path, detail=True)
    digest = hashlib.sha256()
    for name in sorted(found):
        info = found[name]
        if info.get("type") == "directory":
            continue
        stamp = (
            info.get("ETag")
            or info.get("etag")
            or info.get("md5Hash")
            or info.get("mtime")
            or info.get("LastModified")
            or info.get("last_modified")
            or info.get("created")
        )
        digest.update(json.dumps([str(name)[len(str(path)) :], info.get("size"), str(stamp)]).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:32]


# -- the controller ----------------------------------------------------------------------------


class ControllerMetrics:
    """The controller's own registry (``GET /metrics`` on ``DSAGENT_CONTROLLER_METRICS_PORT``)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created twins
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.leader = Gauge("dsplatform_controller_leader", "1 while this replica holds the Lease.", registry=r)
        self.passes = Counter("dsplatform_controller_passes", "Reconcile passes, by result.", ["result"], registry=r)
        self.pass_seconds = Histogram(
            "dsplatform_controller_pass_seconds", "Seconds one pass over every Dataset took.", registry=r
        )
        self.datasets = Counter(
            "dsplatform_controller_reconciles", "Datasets reconciled, by result.", ["result"], registry=r
        )
        self.pack_jobs = Counter(
            "dsplatform_controller_pack_jobs", "Pack Jobs created for new source listings.", registry=r
        )
        self.preparations = Gauge(
            "dsplatform_controller_preparations",
            "Pods whose datasets are being prepared on the node predicted for them, by phase (1 reserved, 2 fetching).",
            ["phase"],
            registry=r,
        )
        self.preparation_releases = Counter(
            "dsplatform_controller_preparation_releases",
            "Prepare tasks released because the plan dropped them (bound, gone, predicted elsewhere).",
            registry=r,
        )
        self.versions_by_copies = Gauge(
            "dsplatform_controller_dataset_versions",
            "Dataset versions held ready somewhere in the cluster, by copies (1, 2, 3+).",
            ["copies"],
            registry=r,
        )
        for result in ("ok", "error"):  # series exist before the first error
            self.passes.labels(result=result)
            self.datasets.labels(result=result)


CONTROLLER_PREFIX = "DSAGENT_CONTROLLER_"
_PRESETS = Thresholds()  # next-job preparation's default presets


def _controller_env(name: str, field: str) -> Any:
    """The field's variable is ``DSAGENT_CONTROLLER_<name>``; its own name still works as a keyword."""
    return AliasChoices(field, CONTROLLER_PREFIX + name)


def _off_is_none(value: Any) -> Any:
    """``off``, ``none`` or ``0`` (any case): the feature is off."""
    return None if isinstance(value, str) and value.strip().lower() in ("off", "none", "0") else value


def _copies_configmap(value: Any) -> Any:
    """``off`` or ``none`` (any case): the controller publishes no copy counts."""
    return None if isinstance(value, str) and value.strip().lower() in ("off", "none") else value


class ControllerSettings(EnvSettings):
    """``DSAGENT_CONTROLLER_*`` (and the agents' admin token, ``DSAGENT_ADMIN_TOKEN[_FILE]``);
    an empty variable means its default."""

    model_config = SettingsConfigDict(env_prefix=CONTROLLER_PREFIX, env_ignore_empty=True)

    namespace: str = "default"  # where the Lease and the pack Jobs live
    lease_name: str = Field("dsplatform-dataset-controller", validation_alias=_controller_env("LEASE", "lease_name"))
    identity: str = Field(default_factory=socket.gethostname)
    resync_s: Duration = Field(30.0, validation_alias=_controller_env("RESYNC", "resync_s"))
    pack_image: str = "ghcr.io/dsplatform/dsplatform:0.1.0"
    pack_service_account: str | None = None
    agent_selector: str = "app.kubernetes.io/component=agent"
    agent_port: int = 7420
    admin_token: str | None = Field(
        None, repr=False, validation_alias=AliasChoices("admin_token", "DSAGENT_ADMIN_TOKEN")
    )
    admin_token_file: Path | None = Field(
        None, repr=False, validation_alias=AliasChoices("admin_token_file", "DSAGENT_ADMIN_TOKEN_FILE")
    )
    metrics_port: int | None = None  # serve /metrics (and /healthz) here; 0 or unset: not served
    # where agents read copy counts; None ("off"): not published
    copies_configmap: Annotated[str | None, BeforeValidator(_copies_configmap)] = copies.CONFIGMAP
    # next-job preparation (docs/design.md#next-job-preparation): on with DSAGENT_CONTROLLER_PREPARE,
    # with these presets; ``prepare`` is what the controller uses (None: off), built from them
    prepare_enabled: Flag = Field(False, validation_alias=_controller_env("PREPARE", "prepare_enabled"))
    prepare_window: Duration = _PRESETS.window_s
    prepare_fetch_lead: Duration = _PRESETS.fetch_lead_s
    prepare_reserve_fraction: float = _PRESETS.reserve_fraction
    prepare_fill_fraction: float = _PRESETS.fill_fraction
    prepare: InstanceOf[Thresholds] | None = not_from_env(None)
    # replication: pods started this recently count as demand; "auto" asks for at most this many copies
    replicas_window_s: Duration = Field(
        3600.0, validation_alias=_controller_env("REPLICAS_WINDOW", "replicas_window_s")
    )
    replicas_max: int = 16
    # store gc Jobs (dsagent/cluster/storegc.py) this often; None ("off", "none", "0"): not run
    store_gc_s: Annotated[Duration | None, BeforeValidator(_off_is_none)] = Field(
        None, validation_alias=_controller_env("STORE_GC", "store_gc_s")
    )
    store_gc_grace_s: Duration = Field(  # never delete a bundle younger than this
        7 * 86400.0, validation_alias=_controller_env("STORE_GC_GRACE", "store_gc_grace_s")
    )

    # migration, step 5 of the deadline design: move jobs that opted in (evictions); the GPU
    # resource and the class resources' prefix as the webhook writes them (chart: gpuClasses.*)
    migrate: Flag = Field(False, validation_alias=_controller_env("MIGRATE", "migrate"))
    gpu_resource: str = GPU_RESOURCE
    class_prefix: str = RESOURCE_PREFIX

    @field_validator("metrics_port")
    @classmethod
    def _metrics_port(cls, value: int | None) -> int | None:
        return value or None

    @field_validator("prepare_reserve_fraction", "prepare_fill_fraction")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0 <= value <= 1:
            raise ValueError(f"{value!r} is not a fraction within [0, 1]")
        return value

    @model_validator(mode="after")
    def _whole_settings(self) -> ControllerSettings:
        if self.admin_token is None and self.admin_token_file is not None:
            object.__setattr__(self, "admin_token", read_secret_file(self.admin_token_file, "DSAGENT_ADMIN_TOKEN_FILE"))
        if self.prepare is None and self.prepare_enabled:
            thresholds = Thresholds(
                window_s=self.prepare_window,
                fetch_lead_s=self.prepare_fetch_lead,
                reserve_fraction=self.prepare_reserve_fraction,
                fill_fraction=self.prepare_fill_fraction,
            )
            object.__setattr__(self, "prepare", thresholds)
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ControllerSettings:
        """The settings from the environment (``os.environ`` unless given); one :class:`SettingsError`
        lists every bad variable."""
        try:
            return cls.read(environ)
        except InvalidSettings as exc:
            raise SettingsError(exc.message) from None


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


def _label_match(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def job_name(dataset: str, fingerprint: str) -> str:
    return f"{dataset[:40]}-pack-{fingerprint[:12]}".lower()


def warm_task_id(namespace: str, name: str) -> str:
    return f"warm.{namespace}.{name}"


def prepare_task_id(pod_uid: str) -> str:
    """The agent task that holds a waiting pod's prepared datasets (docs/design.md#next-job-preparation)."""
    return f"prepare.{pod_uid}"


class DatasetController:
    """Reconciles Datasets; :meth:`run_forever` for the process, :meth:`reconcile_all` in tests."""

    def __init__(
        self,
        api_client: Any,
        settings: ControllerSettings,
        *,
        clock: Callable[[], float] = time.time,
        agent_call: AgentCall | None = None,
        fingerprint: Callable[[str, Mapping[str, Any] | None], str] = listing_fingerprint,
    ) -> None:
        from kubernetes.client import BatchV1Api, CoreV1Api, CustomObjectsApi

        self.settings, self.clock, self.fingerprint = settings, clock, fingerprint
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
        self._node_reader: Any = None  # scheduler_plugin's NodeReader, made on the first migration pass
        self.metrics = ControllerMetrics()
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
        nodes = self._raw(self._core.list_node)["items"]
        inventories = {}
        for node in nodes:
            meta = node.get("metadata") or {}
            inv = parse_inventory((meta.get("annotations") or {}).get(INVENTORY_ANNOTATION))
            if inv is not None:
                inventories[meta.get("name", "")] = inv
        self._agent_urls = self._find_agents()
        try:
            self.publish_copies(inventories)
        except Exception:  # counts are an optimisation: never let them stop a pass
            log.exception("publishing the copy counts failed; agents fall back to LRU once theirs are stale")
        datasets = self._raw(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)["items"]
        self._preparation = {}
        self._nodes_now = nodes
        self._pods_now = None  # listed at most once per pass, when something needs them
        if self.settings.prepare is not None:
            try:
                self._preparation = self.prepare_pass(nodes, inventories, datasets, self.settings.prepare)
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
        if self.settings.migrate:
            try:
                self.migrate_pass(nodes)
            except Exception:  # a move is an optimisation: never let it stop a pass
                log.exception("migration failed this pass")

    def migrate_pass(self, nodes: list[JSON]) -> list[Any]:
        """Step 5 (docs/design.md#deadline-migration): the moves made this pass. The nodes'
        facts are read as the extender reads them; the policy and the evictions are
        :class:`scheduler_plugin.migrator.Migrator`'s."""
        from scheduler_plugin.migrator import Migrator, MigratorSettings, node_facts
        from scheduler_plugin.nodeinfo import NodeReader

        s = self.settings
        resources = MigratorSettings(gpu_resource=s.gpu_resource, class_prefix=f"{s.class_prefix}/{CLASS_STEM}")
        if self._node_reader is None:
            self._node_reader = NodeReader(gpu_resource=resources.gpu_resource, roce_prefix=resources.class_prefix)
        facts = node_facts(nodes, self._pods(), self._node_reader)
        return Migrator(self._core.api_client, lambda: facts, clock=self.clock, settings=resources).run_once()

    def reconcile(self, ds: JSON, nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]]) -> JSON:
        """One Dataset: the status patch it needs (also written, when it changes anything)."""
        meta, spec = ds.get("metadata") or {}, ds.get("spec") or {}
        status = ds.get("status") or {}
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        ready = ready_nodes(inventories, name, status.get("digest"))
        patch: JSON = {"readyNodes": ready, "readyNodeCount": len(ready)}
        pack: JSON = spec["pack"] if isinstance(spec.get("pack"), dict) else {}
        if pack.get("auto") is True and isinstance(spec.get("source"), str) and isinstance(spec.get("bundles"), str):
            patch["pack"] = self._pack(namespace, name, spec, pack, status.get("pack") or {})
        warm = spec.get("warm") if isinstance(spec.get("warm"), dict) else None
        previous = status.get("warm") or {}
        if warm is not None or previous.get("nodes"):
            patch["warm"] = self._warm(namespace, name, spec, warm, previous, nodes, inventories)
        prepared = self._preparation.get((namespace, name)) if self._preparation is not None else None
        if prepared is not None or (self._preparation is not None and status.get("preparation")):
            patch["preparation"] = prepared or {"reservedBytes": 0, "fetchingBytes": 0, "pods": []}
        mode = replication.parse_mode(spec.get("replicas"))
        if mode is not None or (status.get("replicas") or {}).get("nodes"):
            patch["replicas"] = self._replicate(namespace, name, spec, status, mode, ready, inventories)
        request = (meta.get("annotations") or {}).get(CLEANUP_ANNOTATION)
        if isinstance(request, str) and request and request[:253] != (status.get("cleanup") or {}).get("request"):
            patch["cleanup"] = self._cleanup(name, request[:253])
        changed = {k: v for k, v in patch.items() if status.get(k) != v}
        if changed:
            self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": changed}, _content_type=MERGE_PATCH
            )
        return patch

    # -- copy counts (docs/design.md#cluster-eviction) ------------------------------------

    def publish_copies(self, inventories: Mapping[str, Mapping[str, Any]]) -> dict[copies.Key, int]:
        """Count each version's ready copies and write them where the agents read them."""
        counts = copies.count_copies(inventories.values())
        for label, low, high in (("1", 1, 1), ("2", 2, 2), ("3+", 3, None)):
            self.metrics.versions_by_copies.labels(copies=label).set(
                sum(1 for c in counts.values() if c >= low and (high is None or c <= high))
            )
        name = self.settings.copies_configmap
        if name is None:
            return counts
        from kubernetes.client.exceptions import ApiException

        data = {copies.DATA_KEY: copies.copies_document(counts, at=self.clock())}
        try:
            self._core.patch_namespaced_config_map(
                name, self.settings.namespace, {"data": data}, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": self.settings.namespace,
                    "labels": {"app.kubernetes.io/part-of": "dsplatform", "app.kubernetes.io/component": "controller"},
                },
                "data": data,
            }
            self._core.create_namespaced_config_map(self.settings.namespace, body)
        return counts

    def _pods(self) -> list[JSON]:
        if self._pods_now is None:
            self._pods_now = self._raw(self._core.list_pod_for_all_namespaces)["items"]
        return self._pods_now

    # -- replication of hot data (docs/design.md#replication) -------------------------------

    def _replicate(
        self,
        namespace: str,
        name: str,
        spec: JSON,
        status: JSON,
        mode: str | int | None,
        ready: list[str],
        inventories: Mapping[str, Mapping[str, Any]],
    ) -> JSON:
        from dsagent.cluster.prepare import demand, free_gpus

        task = f"replica.{namespace}.{name}"
        previous = status.get("replicas") or {}
        before = [str(n.get("node")) for n in previous.get("nodes") or [] if isinstance(n, dict)]
        if mode is None:  # spec.replicas removed: release every copy it held
            for node in before:
                self.agent_call(node, "DELETE", f"/v1/tasks/{task}", None)
            return {"mode": "off", "demand": 0, "target": 0, "actual": len(ready), "nodes": []}
        pods = self._pods()
        wanted = demand(pods, namespace, name, now=self.clock(), window_s=self.settings.replicas_window_s)
        goal = replication.target(mode, wanted, max_auto=self.settings.replicas_max)
        gpus = free_gpus(self._nodes_now, pods)
        rooms = []
        for node in sorted(self._agent_nodes()):
            given = (inventories.get(node) or {}).get("freeBytes")
            free = given if isinstance(given, int) and not isinstance(given, bool) else 0
            rooms.append(replication.NodeRoom(node, node in ready, free, gpus.get(node, 0)))
        given_size = status.get("bytes")
        size = given_size if isinstance(given_size, int) and not isinstance(given_size, bool) else 0
        chosen = replication.choose(rooms, goal, size_bytes=size, before=before)
        reports = self._hold_on(task, name, spec, before, chosen)
        return {
            "mode": mode,
            "demand": wanted,
            "target": goal,
            "actual": len(ready),
            "desiredNodes": len(chosen),
            "nodes": reports,
        }

    # -- next-job preparation (docs/design.md#next-job-preparation) -----------------------

    def prepare_pass(
        self, nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]], datasets: list[JSON], presets: Thresholds
    ) -> dict[tuple[str, str], JSON]:
        """Plan, ask the agents for phase 2, release what the plan dropped; the status per Dataset."""
        from dsagent.cache.preparation import plan
        from dsagent.cluster.prepare import node_states, waiting_pods

        pods = self._pods()
        by_key = {
            ((d.get("metadata") or {}).get("namespace", "default"), (d.get("metadata") or {}).get("name", "")): d
            for d in datasets
        }
        previous = [
            entry
            for d in datasets
            for entry in (((d.get("status") or {}).get("preparation") or {}).get("pods") or [])
            if isinstance(entry, dict) and isinstance(entry.get("uid"), str) and isinstance(entry.get("node"), str)
        ]
        asked = {(e["uid"], e["node"]) for e in previous if e.get("phase") == 2}
        waiting = waiting_pods(pods, by_key)
        pod_of = {w.key: pod for w, pod in waiting}
        preps = plan(
            node_states(nodes, pods, inventories),
            [w for w, _ in waiting],
            now=self.clock(),
            thresholds=presets,
            fetching=asked,
        )
        out: dict[tuple[str, str], JSON] = {}
        fetching: set[tuple[str, str]] = set()
        for prep in preps:
            pod = pod_of[prep.job]
            namespace = (pod.get("metadata") or {}).get("namespace") or "default"
            state = "reserved"
            if prep.phase == 2:
                state = self._ask_to_prepare(prep, namespace, by_key)
                if state != "skipped":
                    fetching.add((prep.job, prep.node))
            for want in prep.datasets:
                entry = out.setdefault((namespace, want.name), {"reservedBytes": 0, "fetchingBytes": 0, "pods": []})
                entry["reservedBytes"] += want.size_bytes
                if prep.phase == 2:
                    entry["fetchingBytes"] += want.size_bytes
                entry["pods"].append(
                    {
                        "pod": f"{namespace}/{(pod.get('metadata') or {}).get('name', '')}",
                        "uid": prep.job,
                        "node": prep.node,
                        "phase": prep.phase,
                        "state": state,
                        "expectedStart": format_micro_time(prep.start),
                    }
                )
        for uid, node in sorted(asked - fetching):  # cleanup: at once an eviction candidate
            self.agent_call(node, "DELETE", f"/v1/tasks/{prepare_task_id(uid)}", None)
            self.metrics.preparation_releases.inc()
        self.metrics.preparations.labels(phase="1").set(sum(1 for p in preps if p.phase == 1))
        self.metrics.preparations.labels(phase="2").set(len(fetching))
        return out

    def _ask_to_prepare(self, prep: Preparation, namespace: str, by_key: Mapping[tuple[str, str], JSON]) -> str:
        requests = []
        for want in prep.datasets:
            spec = (by_key.get((namespace, want.name)) or {}).get("spec") or {}
            if not isinstance(spec.get("source"), str) or spec.get("storageSecretRef"):
                return "skipped"  # a Secret's options reach only the pod's own request (rule 5)
            request = {"name": want.name, "source": spec["source"]}
            if isinstance(spec.get("bundles"), str):
                request["bundles"] = spec["bundles"]
                request["allowPerFile"] = True  # the cluster path: see dsagent.cluster.podenv
            requests.append(request)
        answer = self.agent_call(prep.node, "PUT", f"/v1/tasks/{prepare_task_id(prep.job)}", {"datasets": requests})
        report = _warm_report(prep.node, answer)
        return str(report["state"])

    # -- packing --------------------------------------------------------------------------

    def _pack(self, namespace: str, name: str, spec: JSON, pack: JSON, previous: JSON) -> JSON:
        from kubernetes.client.exceptions import ApiException

        try:
            fingerprint = self.fingerprint(spec["source"], None)
        except Exception as exc:  # an unreadable source: say so, try again next resync
            return {**previous, "state": "SourceUnreadable", "message": f"{type(exc).__name__}: {exc}"[:500]}
        if fingerprint == previous.get("fingerprint") and previous.get("state") in ("Succeeded", "Failed"):
            return previous  # packed (or failed) for this very listing: nothing new to do
        job = job_name(name, fingerprint)
        try:
            found = self._raw(self._batch.read_namespaced_job, job, self.settings.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._batch.create_namespaced_job(
                self.settings.namespace, self._job(job, namespace, name, spec, pack, fingerprint)
            )
            self.metrics.pack_jobs.inc()
            log.info(
                "Dataset %s/%s: source listing %s is new; packing in Job %s", namespace, name, fingerprint[:12], job
            )
            return {
                "fingerprint": fingerprint,
                "job": job,
                "state": "Running",
                "startTime": format_micro_time(self.clock()),
            }
        conditions = {
            c.get("type"): c for c in (found.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
        }
        state = "Succeeded" if "Complete" in conditions else "Failed" if "Failed" in conditions else "Running"
        out = {
            "fingerprint": fingerprint,
            "job": job,
            "state": state,
            "startTime": previous.get("startTime") or format_micro_time(self.clock()),
        }
        if state == "Failed":
            out["message"] = str(
                conditions["Failed"].get("message") or conditions["Failed"].get("reason") or "the pack Job failed"
            )[:500]
        return out

    def _job(self, job: str, namespace: str, name: str, spec: JSON, pack: JSON, fingerprint: str) -> JSON:
        # Every field is hostile input: values go after their flag (click never reads them as
        # flags) and the source after "--", so "--publish=other-namespace" is only a path.
        args = ["pack", "--name", name, "--to", spec["bundles"], "--publish", namespace]
        for key, flag in (("maxFiles", "--max-files"), ("maxBytes", "--max-bytes"), ("level", "--level")):
            if isinstance(pack.get(key), int) and not isinstance(pack.get(key), bool):
                args += [flag, str(pack[key])]
        args += ["--", spec["source"]]
        pod = job_pod("pack", self.settings.pack_image, args, self.settings.pack_service_account)
        labels = {
            "app.kubernetes.io/part-of": "dsplatform",
            "app.kubernetes.io/component": "pack",
            "dsagent.io/dataset": name[:63],
            "dsagent.io/dataset-namespace": namespace[:63],
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job,
                "namespace": self.settings.namespace,
                "labels": labels,
                "annotations": {"dsagent.io/source-fingerprint": fingerprint},
            },
            "spec": {
                "backoffLimit": 2,
                "ttlSecondsAfterFinished": 7 * 86400,
                "template": {"metadata": {"labels": labels}, "spec": pod},
            },
        }

    # -- warm-up --------------------------------------------------------------------------

    def _warm(
        self,
        namespace: str,
        name: str,
        spec: JSON,
        warm: JSON | None,
        previous: JSON,
        nodes: list[JSON],
        inventories: Mapping[str, Mapping[str, Any]],
    ) -> JSON:
        task = warm_task_id(namespace, name)
        before = [str(n.get("node")) for n in previous.get("nodes") or [] if isinstance(n, dict)]
        start = parse_or_none(warm.get("startTime")) if warm else None
        if warm is None or (start is not None and start > self.clock()):
            for node in before:
                self.agent_call(node, "DELETE", f"/v1/tasks/{task}", None)
            return {
                "state": "Waiting" if warm is not None else "Off",
                "nodes": [],
                "readyNodes": 0,
                "desiredNodes": 0,
                "bytesDone": 0,
                "bytesWanted": 0,
            }
        chosen = self._choose(name, warm, before, nodes, inventories)
        reports = self._hold_on(task, name, spec, before, chosen)
        ready = sum(1 for r in reports if r["state"] == "ready")
        desired = len(chosen)
        return {
            "state": "Ready" if desired and ready == desired else "Warming",
            "desiredNodes": desired,
            "readyNodes": ready,
            "nodes": reports,
            "bytesDone": sum(r["bytesDone"] for r in reports),
            "bytesWanted": sum(r["bytesWanted"] for r in reports),
        }

    def _hold_on(self, task: str, name: str, spec: JSON, before: list[str], chosen: list[str]) -> list[JSON]:
        """Move the agent task ``task`` (the Dataset's source and store) from the nodes in
        ``before`` to those in ``chosen``: released where it is no longer wanted, asked
        (idempotently) on every chosen node; their reports, in ``chosen``'s order."""
        for node in before:
            if node not in chosen:
                self.agent_call(node, "DELETE", f"/v1/tasks/{task}", None)
        request = {"name": name, "source": spec.get("source")}
        if isinstance(spec.get("bundles"), str):
            request["bundles"] = spec["bundles"]
            request["allowPerFile"] = True  # the cluster path: see dsagent.cluster.podenv
        return [
            _warm_report(node, self.agent_call(node, "PUT", f"/v1/tasks/{task}", {"datasets": [request]}))
            for node in chosen
        ]

    def _choose(
        self, name: str, warm: JSON, before: list[str], nodes: list[JSON], inventories: Mapping[str, Mapping[str, Any]]
    ) -> list[str]:
        selector = warm.get("nodeSelector") if isinstance(warm.get("nodeSelector"), dict) else None
        eligible = [
            (n.get("metadata") or {}).get("name", "")
            for n in nodes
            if (selector is None or _label_match(selector, (n.get("metadata") or {}).get("labels") or {}))
            and (n.get("metadata") or {}).get("name") in self._agent_nodes()
        ]
        if selector is not None and not isinstance(warm.get("nodes"), int):
            return sorted(eligible)
        wanted = warm.get("nodes")
        count = max(0, wanted) if isinstance(wanted, int) and not isinstance(wanted, bool) else 1

        def rank(node: str) -> tuple[int, int, int, str]:
            inv = inventories.get(node) or {}
            holds = name in (inv.get("datasets") or {})
            given = inv.get("freeBytes")
            free = given if isinstance(given, int) else 0
            return (0 if node in before else 1, 0 if holds else 1, -free, node)

        return sorted(sorted(eligible, key=rank)[:count])

    def _agent_nodes(self) -> set[str]:
        """Nodes with a running agent (found from the agent DaemonSet's pods)."""
        return set(self._agent_urls)

    # -- cleanup --------------------------------------------------------------------------

    def _cleanup(self, name: str, request: str) -> JSON:
        evicted: list[str] = []
        kept: list[str] = []
        absent: list[str] = []
        for node in sorted(self._agent_urls):
            answer = self.agent_call(node, "POST", "/v1/evict", {"mode": "names", "names": [name]})
            if answer is None:
                continue
            code, _ = answer
            (evicted if code == 200 else kept if code == 409 else absent).append(node)
        log.info("cleanup of dataset %s: evicted on %s, kept (in use) on %s", name, evicted, kept)
        return {"request": request, "time": format_micro_time(self.clock()), "evictedNodes": evicted, "keptInUse": kept}

    # -- plumbing -------------------------------------------------------------------------

    @staticmethod
    def _raw(call: Callable[..., Any], *args: Any) -> Any:
        return json.loads(call(*args, _preload_content=False).data)

    def _find_agents(self) -> dict[str, str]:
        """node -> the agent's base URL, from the agent DaemonSet's running pods."""
        pods = self._raw(
            lambda **kw: self._core.list_namespaced_pod(
                self.settings.namespace, label_selector=self.settings.agent_selector, **kw
            )
        )["items"]
        urls = {}
        for pod in pods:
            node, ip = (pod.get("spec") or {}).get("nodeName"), (pod.get("status") or {}).get("podIP")
            if node and ip and (pod.get("status") or {}).get("phase") == "Running":
                host = f"[{ip}]" if ":" in ip else ip
                urls[node] = f"http://{host}:{self.settings.agent_port}"
        return urls

    def _http_agent_call(self, node: str, method: str, path: str, body: JSON | None) -> tuple[int, Any] | None:
        import httpx

        base = self._agent_urls.get(node)
        if base is None:
            return None
        headers = {"Authorization": f"Bearer {self.settings.admin_token}"} if self.settings.admin_token else {}
        try:
            response = httpx.request(method, base + path, json=body, headers=headers, timeout=10)
        except httpx.HTTPError as exc:
            log.warning("agent on node %s unreachable: %s", node, exc)
            return None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None


def _warm_report(node: str, answer: tuple[int, Any] | None) -> JSON:
    """What one agent says about a warm-up task: its state and bytes, never more."""
    if answer is None:
        return {"node": node, "state": "unreachable", "bytesDone": 0, "bytesWanted": 0}
    code, body = answer
    datasets = body.get("datasets") if isinstance(body, dict) else None
    item = datasets[0] if isinstance(datasets, list) and datasets and isinstance(datasets[0], dict) else {}
    if code != 200 or not item:
        message = body.get("message") if isinstance(body, dict) else None
        return {
            "node": node,
            "state": "failed",
            "bytesDone": 0,
            "bytesWanted": 0,
            "message": str(message or code)[:300],
        }

    def number(key: str) -> int:
        value = item.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    state = item.get("state") if item.get("state") in ("ready", "fetching", "resolving", "failed") else "unknown"
    report = {"node": node, "state": state, "bytesDone": number("bytesDone"), "bytesWanted": number("sizeBytes")}
    if state == "failed" and isinstance(item.get("error"), dict):
        report["message"] = str(item["error"].get("message"))[:300]
    return report


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


def serve_metrics(port: int, registry: Any, host: str = "0.0.0.0") -> Any:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` in a daemon thread; returns the server.

    prometheus_client's own server answered every path with the metrics text, so the
    liveness probe's ``/healthz`` got Prometheus text where every other process answers
    the one probe body (docs/design.md#probes). The controller is alive and ready while
    this thread serves: a standby replica is ready too (it takes over when the leader goes).
    """
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    from dsplatform import probes

    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            return metrics(environ, start_response)
        status, body = probes.encoded(probes.OK if path == "/healthz" else probes.READY)
        start_response(f"{status} OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # a probe every few seconds is not worth a log line

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="controller-metrics", daemon=True).start()
    return server


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = [
    "ControllerSettings",
    "DatasetController",
    "LeaseElector",
    "listing_fingerprint",
    "prepare_task_id",
    "parse_inventory",
    "ready_nodes",
]
