"""A watch-backed cache of Nodes and Pods, for ``nodeCacheCapable`` (names-only) requests.

Daemon threads list then watch ``/api/v1/nodes``, ``/api/v1/pods``, the ``NodeCache`` and the
``Dataset`` custom resources (each optional: its CRD may be absent) with the official ``kubernetes`` client
(raw JSON, no model deserialization: thousands of Nodes
must stay cheap), resuming from the last ``resourceVersion`` (bookmarks included) and
re-listing on ``410 Gone``. Node objects, with what their ``NodeCache`` publishes in place of
the annotations it replaces (:func:`dsplatform.wire.nodecache.overlay`; a node without one
keeps its own: an agent of the release before, docs/operator-guide/upgrade.md#nodecache),
become :class:`NodeFacts` through the shared :class:`NodeReader`; active pods bound to a
node count against its free GPUs when the node publishes no free-GPU list. The pods of
multi-worker jobs that kube-scheduler could not place (unbound, ``PodScheduled`` False with
reason ``Unschedulable``) are the jobs whole nodes are kept for
(:meth:`NodeCache.waiting`, docs/design.md#whole-nodes), each on the nodes its pods' rules
allow: every node's facts carry the number of its placement key
(:func:`scheduling.nodefit.placement_key`, each distinct key and label pair kept once), and a
job's rules are asked once per key. Readers get
consistent snapshots: each update replaces one dict entry (atomic under the GIL). Owned by
:class:`scheduler_plugin.view.View`. The list+watch loop, its retries (tenacity, fixed
waits) and its stop are :class:`dsplatform.listwatch.Watches`'.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client as k8s
from kubernetes.watch.watch import iter_resp_lines

from dsplatform.errors import InvalidInput
from dsplatform.gpus import GpuResources, pod_gpus
from dsplatform.jobs import DEFAULT_JOB_LABELS, job_key, workers_of
from dsplatform.kubetime import parse_or_none
from dsplatform.listwatch import Absent, Watches
from dsplatform.wire import nodecache as nodecache_contract
from scheduler_plugin.catalog import (
    GROUP,
    PLURAL,
    VERSION,
    CurrentVersion,
    read_dataset,
)
from scheduler_plugin.columns import NodeColumns
from scheduler_plugin.errors import SettingsError, ViewUnavailable
from scheduler_plugin.filter import NO_WAITING, Waiting
from scheduler_plugin.wire import Pod
from scheduling.nodefit import PlacementKey, PodRules, allowed_on, placement_key, pod_rules
from scheduling.nodeinfo import NodeFacts, NodeReader
from scheduling.podspec import pod_is_active, queue_place

log = logging.getLogger(__name__)

#: at most this many placement keys, and answers of a pod's rules on one, are kept: past
#: that, both start again (a cluster has a few dozen pools; labels that change all the
#: time would otherwise grow them without end)
PLACEMENTS_LIMIT = 65_536

#: node rules longer than this (as canonical JSON) are not kept: a real selector, affinity and
#: tolerations take a few hundred bytes, and the API server admits pods of up to ~1.5 MB; each
#: unplaced pod of a multi-worker job holds its rules, so this bounds what they cost
RULES_TEXT_LIMIT = 4 << 10

#: an unplaced pod of a multi-worker job: (job, GPUs, queue place, its node rules (None:
#: rules that name nodes one by one, or that cannot be read), the job's workers)
Unplaced = tuple[str, int, tuple[int, float], PodRules | None, int]


class NodeCache:
    """Nodes and pod GPU usage, kept current by list+watch."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        reader: NodeReader,
        *,
        gpu_resource: str,
        roce_prefix: str,
        watch_timeout_s: int = 300,
        retry_s: float = 1.0,
        page_size: int = 500,
        on_listed: Callable[[], None] | None = None,
        job_labels: Sequence[str] = DEFAULT_JOB_LABELS,
    ) -> None:
        self._api = k8s.CoreV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._reader = reader
        self._gpu_names = GpuResources.of_class_prefix(gpu_resource, roce_prefix)
        self._watches = Watches(
            iter_resp_lines, log, watch_timeout_s=watch_timeout_s, retry_s=retry_s, page_size=page_size
        )
        self._on_listed = on_listed  # after each full list (the app settles its heap there)
        # Base facts (no pod usage) per node: the raw Node objects are not kept, since
        # 5,000 parsed Nodes would cost hundreds of MiB.
        self._nodes: dict[str, NodeFacts] = {}
        # What facts are rebuilt from when a node's NodeCache changes: its Node less the
        # annotations a NodeCache replaces (small), and each NodeCache's published state.
        self._slim: dict[str, Any] = {}
        self._states: dict[str, nodecache_contract.NodeState] = {}
        # The same with pod usage applied, and the columns names-only requests read
        # (scheduler_plugin/columns.py), updated together on every event.
        self._columns = NodeColumns()
        self._pods: dict[str, tuple[str, int]] = {}  # pod key -> (node, GPUs)
        self._job_labels = tuple(job_labels)
        # pod key -> what the filters read of the unplaced pods of multi-worker jobs, and
        # the Waiting built from them again at the first read after a change
        self._unplaced: dict[str, Unplaced] = {}
        self._waiting: Waiting | None = NO_WAITING
        # the nodes' placement keys, each once with a number the node's facts carry (a key
        # dropped when the table is full keeps its number: a number is never given twice),
        # their label pairs, the waiting pods' rules, each once, and what rules answer on a key
        self._placements: dict[PlacementKey, int] = {}
        self._placement_keys: dict[int, PlacementKey] = {}
        self._placement_count = 0
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self._rules: dict[str, PodRules] = {}
        self._allowed: dict[tuple[str, int], bool] = {}
        self._used: dict[str, int] = {}  # node -> GPUs of its active pods
        self._datasets: dict[tuple[str, str], CurrentVersion] = {}
        self._lock = threading.Lock()
        self._synced = {"nodes": threading.Event(), "pods": threading.Event(), "nodecaches": threading.Event()}

    # -- reading ---------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return all(event.is_set() for event in self._synced.values())

    def wait_synced(self, timeout: float) -> bool:
        return all(event.wait(timeout) for event in self._synced.values())

    def facts(self, name: str) -> NodeFacts | None:
        """The facts of a known node; None for a node the cache has not seen."""
        if not self.synced:
            raise ViewUnavailable("the node cache has not finished its first list yet")
        return self._columns.facts.get(name)

    def snapshot(self) -> Mapping[str, NodeFacts]:
        """The current name -> facts map (read-only by convention; updated in place)."""
        return self._columns.facts

    def columns(self) -> NodeColumns:
        """The current columns (read-only by convention; updated in place, replaced on a relist)."""
        return self._columns

    def all(self) -> list[NodeFacts]:
        return list(self._columns.facts.values())

    def state(self, node: str) -> nodecache_contract.NodeState | None:
        """What a node's ``NodeCache`` publishes (None: it has none, or none seen yet)."""
        return self._states.get(node)

    def used_gpus(self, node: str) -> int:
        return self._used.get(node, 0)

    def waiting(self) -> Waiting:
        """The multi-worker jobs kube-scheduler tried and could not place, as the filter
        reads them (:class:`~scheduler_plugin.filter.Waiting`)."""
        waiting = self._waiting
        if waiting is None:
            with self._lock:
                waiting = self._waiting = self._gather_waiting()
        return waiting

    def _gather_waiting(self) -> Waiting:
        """:class:`Waiting` of the unplaced pods, each job with the placement keys of the
        nodes its pods' rules allow; none for a job those nodes could never hold: fewer pods
        of its ask fit their GPUs, all free, than it has workers (called under the lock)."""
        jobs = Waiting.of((job, gpus, place) for job, gpus, place, _, _ in self._unplaced.values()).jobs
        by_job: dict[str, dict[str, PodRules]] = {}
        workers: dict[str, int] = {}  # job -> the most workers one of its pods names
        for job, _, _, rules, count in self._unplaced.values():
            held = by_job.setdefault(job, {})
            if rules is not None:
                held[rules.key] = rules
            workers[job] = max(workers.get(job, 0), count)
        # nodes by placement key and GPU count: a cluster has few distinct pairs
        sizes: dict[tuple[int, int], int] = {}
        for facts in self._nodes.values():
            if isinstance(facts.placement, int):
                pair = (facts.placement, facts.allocatable_gpus)
                sizes[pair] = sizes.get(pair, 0) + 1
        keys = {key for key, _ in sizes}
        nodes: dict[str, frozenset[object]] = {}
        for job, named in by_job.items():
            allowed = frozenset(k for k in keys if any(self._allows(rule, k) for rule in named.values()))
            ask = jobs[job][0]
            room = sum(count * (gpus // ask) for (key, gpus), count in sizes.items() if key in allowed)
            nodes[job] = allowed if room >= workers[job] else frozenset()
        return Waiting(jobs, nodes)

    def _allows(self, rules: PodRules, placement: int) -> bool:
        """Whether a pod of ``rules`` may run on the nodes of placement key number
        ``placement`` (remembered; a number whose key is no longer held: no)."""
        found = self._allowed.get((rules.key, placement))
        if found is None:
            key = self._placement_keys.get(placement)
            if key is None:
                return False
            if len(self._allowed) >= PLACEMENTS_LIMIT:
                self._allowed.clear()
            try:
                found = allowed_on(rules, key)
            except InvalidInput:
                found = False
            self._allowed[(rules.key, placement)] = found
        return found

    def current_datasets(self) -> Mapping[tuple[str, str], CurrentVersion]:
        """(namespace, name) -> the current version its Dataset resource publishes."""
        return self._datasets

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        loops = (
            ("nodes", self._nodes_loop),
            ("pods", self._pods_loop),
            ("nodecaches", self._nodecaches_loop),
            ("datasets", self._datasets_loop),
        )
        for kind, run in loops:
            self._watches.start(kind, run, thread_name=f"dsext-watch-{kind}")

    def stop(self, timeout: float = 5.0) -> None:
        self._watches.stop(timeout)

    # -- nodes -------------------------------------------------------------------

    def _nodes_loop(self) -> None:
        items, version = self._watches.list("nodes", self._api.list_node)
        with self._lock:
            slim = {name: _slim(n) for n in items if (name := _name(n))}
            nodes = {name: self._read(name, n) for n in items if (name := _name(n))}
            self._slim = slim
            self._nodes = nodes
            self._waiting = None
            self._columns = NodeColumns({name: self._with_usage(base) for name, base in nodes.items()})
        del items  # the Nodes as sent are not kept while the watch runs (the module docstring)
        self._synced["nodes"].set()
        log.info("node cache listed %d nodes at resourceVersion %s", len(nodes), version)
        if self._on_listed is not None:
            self._on_listed()
        for kind, node in self._watches.watch("nodes", self._api.list_node, version):
            name = _name(node)
            if not name:
                continue
            with self._lock:
                if kind == "DELETED":
                    self._nodes.pop(name, None)
                    self._slim.pop(name, None)
                    self._columns.drop(name)
                    self._waiting = None  # one node fewer for the waiting jobs
                else:
                    self._slim[name] = _slim(node)
                    before = self._nodes.get(name)
                    base = self._nodes[name] = self._read(name, node)
                    self._columns.put(name, self._with_usage(base))
                    same = before is not None and before.placement == base.placement
                    if not same or before.allocatable_gpus != base.allocatable_gpus:  # type: ignore[union-attr]
                        self._waiting = None  # whom it may be kept for, or how many pods it holds, changed

    def _read(self, name: str, node: Any, placement: int | None = None) -> NodeFacts:
        """The facts of ``node`` (a Node as sent, or its slim copy with the ``placement``
        read before) with its NodeCache overlaid, and its placement key's number (called
        under the lock)."""
        facts = self._reader.read(nodecache_contract.overlay(node, self._states.get(name)))  # type: ignore[arg-type]
        if placement is None:
            if len(self._pairs) >= PLACEMENTS_LIMIT:
                self._pairs.clear()
            key = placement_key(node, self._pairs)
            placement = self._placements.get(key)
            if placement is None:
                if len(self._placements) >= PLACEMENTS_LIMIT:
                    self._placements.clear()
                    self._placement_keys.clear()
                placement = self._placements[key] = self._placement_count
                self._placement_keys[placement] = key
                self._placement_count += 1
        return dataclasses.replace(facts, placement=placement)

    # -- nodecaches ----------------------------------------------------------------

    def _nodecaches_loop(self) -> None:
        group, version_, plural = nodecache_contract.GROUP, nodecache_contract.API_VERSION, nodecache_contract.PLURAL
        list_fn = functools.partial(self._custom.list_cluster_custom_object, group, version_, plural)
        try:
            absent = f"no {plural}.{group}/{version_} resource (CRD not installed): reading the Node annotations only"
            items, version = self._watches.list("nodecaches", list_fn, absent=absent)
        except Absent:
            self._synced["nodecaches"].set()  # nothing to wait for: the Node annotations alone
            raise
        states = nodecache_contract.by_node(items)
        del items  # the list as sent is not kept while the watch runs
        with self._lock:
            changed = set(states) | set(self._states)
            self._states = states
            for name in changed:
                self._refresh(name)
        self._synced["nodecaches"].set()
        if self._on_listed is not None:
            self._on_listed()
        for kind, obj in self._watches.watch("nodecaches", list_fn, version):
            with self._lock:
                owner = nodecache_contract.apply_event(self._states, kind, obj)
                if owner is not None:
                    self._refresh(owner)

    def _refresh(self, name: str) -> None:
        """Read a known node again after its NodeCache changed (called under the lock)."""
        slim, held = self._slim.get(name), self._nodes.get(name)
        if slim is None or held is None or not isinstance(held.placement, int):
            return
        base = self._nodes[name] = self._read(name, slim, held.placement)  # the slim copy has no labels
        self._columns.put(name, self._with_usage(base))

    # -- datasets ----------------------------------------------------------------

    def _datasets_loop(self) -> None:
        list_fn = functools.partial(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        absent = f"no {PLURAL}.{GROUP}/{VERSION} resource (CRD not installed): unpinned datasets accept any ready copy"
        items, version = self._watches.list("datasets", list_fn, absent=absent)
        current = {key: version for key, version in map(read_dataset, items) if key and version}
        del items  # the Datasets as sent are not kept while the watch runs
        self._datasets = current
        for kind, obj in self._watches.watch("datasets", list_fn, version):
            key, current_version = read_dataset(obj)
            if key is None:
                continue
            if kind == "DELETED" or current_version is None:
                self._datasets.pop(key, None)
            else:
                self._datasets[key] = current_version

    # -- pods --------------------------------------------------------------------

    def _pods_loop(self) -> None:
        items, version = self._watches.list("pods", self._api.list_pod_for_all_namespaces)
        pods = {key: usage for key, usage in map(self._usage, items) if key and usage}
        unplaced = {key: waits for key, waits in map(self._unplaced_of, items) if key and waits}
        del items  # the pods as sent are not kept while the watch runs
        with self._lock:
            self._pods = pods
            self._unplaced = unplaced
            self._waiting = None
            self._recount()
        self._synced["pods"].set()
        if self._on_listed is not None:
            self._on_listed()
        for kind, pod in self._watches.watch("pods", self._api.list_pod_for_all_namespaces, version):
            key, usage = self._usage(pod)
            if not key:
                continue
            waits = self._unplaced_of(pod)[1] if kind != "DELETED" else None
            with self._lock:
                before = self._pods.pop(key, None)
                if kind != "DELETED" and usage is not None:
                    self._pods[key] = usage
                after = self._pods.get(key)
                if before != after:
                    self._adjust(before, -1)
                    self._adjust(after, +1)
                if self._unplaced.get(key) != waits:
                    if waits is None:
                        del self._unplaced[key]
                    else:
                        self._unplaced[key] = waits
                    self._waiting = None

    def _usage(self, pod: Pod) -> tuple[str | None, tuple[str, int] | None]:
        meta: Any = pod.get("metadata") or {}
        spec: Any = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or not pod_is_active(pod):
            return _pod_key(meta), None
        gpus = self._requested(spec)
        return _pod_key(meta), (node, gpus) if gpus > 0 else None

    def _requested(self, spec: Any) -> int:
        """The GPUs a pod's spec asks for; 0 when its requests cannot be read."""
        try:
            return pod_gpus(spec, self._gpu_names)
        except ValueError:
            return 0

    def _unplaced_of(self, pod: Pod) -> tuple[str | None, Unplaced | None]:
        """``(key, Unplaced)`` of a pod of a multi-worker job asking for GPUs that
        kube-scheduler could not place; ``(key, None)`` for any other pod."""
        meta: Any = pod.get("metadata") or {}
        key = _pod_key(meta)
        spec: Any = pod.get("spec") or {}
        if spec.get("nodeName") or meta.get("deletionTimestamp") or not pod_is_active(pod):
            return key, None
        workers = workers_of(meta.get("annotations"))
        if not _unschedulable(pod.get("status")) or workers <= 1:
            return key, None
        gpus = self._requested(spec)
        if gpus <= 0:
            return key, None
        namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else "default"
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else None
        job = job_key(namespace, labels, self._job_labels) or f"{namespace}/{meta.get('name')}"
        try:
            rules = pod_rules(pod)
        except InvalidInput:
            rules = None  # the API server admits no such pod: keep nothing for it
        if rules is not None:  # the pods of a job share one copy; an outsized one keeps nothing
            rules = None if len(rules.key) > RULES_TEXT_LIMIT else self._one_copy(rules)
        place = queue_place(pod, parse_or_none(meta.get("creationTimestamp")))
        return key, (job, gpus, place, rules, workers)

    def _one_copy(self, rules: PodRules) -> PodRules:
        """The one :class:`PodRules` kept for rules equal to ``rules``."""
        held = self._rules.get(rules.key)
        if held is None:
            if len(self._rules) >= PLACEMENTS_LIMIT:
                self._rules.clear()
            held = self._rules[rules.key] = rules
        return held

    def _recount(self) -> None:
        used: dict[str, int] = {}
        for node_name, gpus in self._pods.values():
            used[node_name] = used.get(node_name, 0) + gpus
        self._used = used
        for name, base in self._nodes.items():
            self._columns.put(name, self._with_usage(base))

    def _adjust(self, usage: tuple[str, int] | None, sign: int) -> None:
        """Add or remove one pod's GPUs from its node (an O(1) update per pod event)."""
        if usage is None:
            return
        name, gpus = usage
        total = self._used.get(name, 0) + sign * gpus
        if total > 0:
            self._used[name] = total
        else:
            self._used.pop(name, None)
        if name in self._nodes:
            self._columns.put(name, self._with_usage(self._nodes[name]))

    def _with_usage(self, base: NodeFacts) -> NodeFacts:
        used = self._used.get(base.name, 0)
        return dataclasses.replace(base, used_gpus=used) if used else base


def _pod_key(meta: Any) -> str:
    """What the cache keys a pod by: its uid, else ``namespace/name``."""
    return meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"


def _unschedulable(status: Any) -> bool:
    """Whether kube-scheduler said it could not place the pod (its ``PodScheduled``
    condition False, reason ``Unschedulable``; the first 32 conditions are read)."""
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if not isinstance(conditions, list):
        return False
    for condition in conditions[:32]:
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled":
            return condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
    return False


def _slim(node: Any) -> dict[str, Any]:
    """What the facts of a node are read from, less the annotations a NodeCache replaces
    (up to 96 KiB a node: kept for none)."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations")
    kept = {
        k: v
        for k, v in (annotations if isinstance(annotations, dict) else {}).items()
        if k not in nodecache_contract.REPLACED_ANNOTATIONS
    }
    status = node.get("status") if isinstance(node.get("status"), dict) else {}
    return {
        "metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion"), "annotations": kept},
        "status": {"allocatable": status.get("allocatable")},
    }


def _name(node: Any) -> str | None:
    meta = node.get("metadata") if isinstance(node, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else None


def api_client_from(kubeconfig: str | None) -> k8s.ApiClient:
    """An API client from the in-cluster service account, else ``kubeconfig`` (or the default)."""
    from kubernetes import config

    configuration = k8s.Configuration()
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)
            return k8s.ApiClient(configuration)
        except config.ConfigException:
            pass
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        if kubeconfig is not None:  # the operator named a file: a setting to fix, not a cluster to wait for
            raise SettingsError(
                f"cannot read the kubeconfig {kubeconfig}: {exc}",
                hint="--kubeconfig / DSEXT_KUBECONFIG must name a kubeconfig file",
            ) from exc
        raise ViewUnavailable(
            f"no Kubernetes configuration: {exc}",
            hint="run in a pod with a service account, or give --kubeconfig / KUBECONFIG",
        ) from exc
    return k8s.ApiClient(configuration)


__all__ = ["NodeCache", "api_client_from"]
