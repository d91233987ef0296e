"""Step 5 of the deadline design in the cluster: move running jobs that checkpoint.

Who calls it: the Dataset controller's leader, once per pass when migration is on
(``DSAGENT_CONTROLLER_MIGRATE``, :class:`MigrationPass` from
:meth:`dsagent.controller.reconcile.DatasetController.reconcile_all`, with :func:`node_facts`
over the Nodes and pods it listed), and the tests with the fake API server. It owns the I/O around the pure policy
:func:`scheduling.migration.plan_migrations`: it lists the running pods, keeps the
jobs that opted in (``dsagent.io/migratable: "true"``, label or annotation) and carry the
time-model annotations, builds their :class:`~scheduling.migration.RunningJob`, and
acts on each move by **evicting** the job's pods through the Eviction API
(``policy/v1`` Eviction, so PodDisruptionBudgets are honoured). Re-placing is the job's
controller re-creating the pods, which kube-scheduler and this extender then place; the
extender's time and dataset scores steer them to the free GPUs the move was planned on.

Decisions (docs/design.md#deadline-migration):

- A job's progress is not observable from the API; it is the time model's: the job ends at
  ``start + t_run`` and has ``(end - now) / (end - start)`` of its work left.
- The move's cost: ``checkpoint_s + restart_s`` plus a re-fetch of the job's datasets at
  ``fetch_bps`` when the target node does not hold them ready.
- An eviction the API refuses (429: a PodDisruptionBudget; 404: the pod is gone) leaves the
  job where it is; the other pods of that job are not evicted then.
- It runs in the controller, not the extender: a move must be decided once for the cluster
  (the controller's leader Lease), while every extender replica answers kube-scheduler. The
  nodes' facts are read as the extender reads them (:class:`~scheduling.nodeinfo.NodeReader`
  over the agents' annotations, the active pods' GPU requests where a node publishes no
  free GPUs), so both see the same free GPUs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from dsagent.kube.apiclient import evict
from dsplatform.gpus import CLASS_RESOURCE_PREFIX, CLASS_STEM, GPU_RESOURCE, GpuResources, pod_gpus
from dsplatform.jobs import DEFAULT_JOB_LABELS, job_key
from dsplatform.kubetime import parse_or_none
from scheduling.kubeobjects import Node, Pod
from scheduling.migration import Migration, RunningJob, is_migratable, plan_migrations
from scheduling.nodeinfo import NodeFacts, NodeReader, pod_bandwidth
from scheduling.podspec import DATASETS_ANNOTATION, parse_datasets, pod_is_active
from scheduling.timemodel import DEFAULT_BANDWIDTHS, parse_profile, t_run

log = logging.getLogger(__name__)

MAX_PODS = 20_000  # one round reads at most this many running pods


@dataclass(frozen=True)
class MigratorSettings:
    checkpoint_s: float = 120.0
    restart_s: float = 180.0
    fetch_bps: float = 669e6  # the agent's measured unpack rate (docs/simulation.md)
    min_gain: float = 0.1
    gpu_resource: str = GPU_RESOURCE
    class_prefix: str = CLASS_RESOURCE_PREFIX  # <prefix>/<stem>: the class resources the webhook writes
    job_labels: tuple[str, ...] = DEFAULT_JOB_LABELS


@dataclass(frozen=True)
class _Pod:
    namespace: str
    name: str
    node: str
    gpus: int
    started: float
    datasets: tuple[str, ...]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def running_jobs(
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, NodeFacts],
    settings: MigratorSettings,
    *,
    now: float,
) -> tuple[list[RunningJob], dict[str, list[_Pod]]]:
    """The migratable running jobs among ``pods`` (raw v1.Pod), and each job's pods."""
    members: dict[str, list[_Pod]] = {}
    profiles: dict[str, Any] = {}
    for pod in pods:
        meta, spec, status = (_dict(pod.get(k)) for k in ("metadata", "spec", "status"))
        labels, annotations = _dict(meta.get("labels")), _dict(meta.get("annotations"))
        if status.get("phase") != "Running" or not is_migratable(labels, annotations):
            continue
        namespace, name, node = (_str(v) for v in (meta.get("namespace"), meta.get("name"), spec.get("nodeName")))
        started = parse_or_none(status.get("startTime"))
        if not (namespace and name and node) or started is None:
            continue
        profile, _ = parse_profile({k: v for k, v in annotations.items() if isinstance(v, str)}, started)
        try:
            gpus = pod_gpus(spec, GpuResources.of_class_prefix(settings.gpu_resource, settings.class_prefix))
        except ValueError:
            continue
        if profile is None or gpus <= 0:
            continue
        key = job_key(namespace, labels, settings.job_labels) or f"{namespace}/{name}"
        wants, _ = parse_datasets(annotations.get(DATASETS_ANNOTATION))
        members.setdefault(key, []).append(_Pod(namespace, name, node, gpus, started, tuple(w.name for w in wants)))
        profiles.setdefault(key, profile)
    jobs = []
    for key, group in members.items():
        per_node: dict[str, int] = {}
        for p in group:
            per_node[p.node] = per_node.get(p.node, 0) + p.gpus
        allocation = tuple(sorted(per_node.items()))
        n = sum(per_node.values())
        if len(allocation) > 1:
            bw = DEFAULT_BANDWIDTHS.network
        else:
            facts = nodes.get(allocation[0][0])
            topology = facts.topology if facts is not None else None
            found = pod_bandwidth(topology, frozenset(topology.gpu_indices) if topology else None, n, 1)
            bw = found[1] if found is not None else DEFAULT_BANDWIDTHS.sys
        start = min(p.started for p in group)
        end = start + t_run(profiles[key], n, bw)
        remaining = (end - now) / (end - start) if end > start else 0.0
        jobs.append(RunningJob(key, profiles[key], allocation, end, min(1.0, remaining), True))
    return jobs, members


def bound_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The active pods bound to each node (by ``spec.nodeName``): those holding its resources.
    Grouped once a pass, for the GPUs (:func:`node_facts`) and for CPU and memory alike."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        bound = _str(_dict(pod.get("spec")).get("nodeName"))
        if bound and pod_is_active(cast(Pod, pod)):
            by_node.setdefault(bound, []).append(pod)
    return by_node


def node_facts(
    nodes: Sequence[dict[str, Any]],
    bound: Mapping[str, Sequence[Mapping[str, Any]]],
    reader: NodeReader,
) -> list[NodeFacts]:
    """The facts of raw v1.Node objects as the extender's node cache builds them: the agents'
    annotations read by ``reader``, with the GPUs the active pods bound to each node request
    (``bound``: :func:`bound_pods`; what the extender counts where a node publishes no free
    GPUs)."""
    names = GpuResources.of_class_prefix(reader.gpu_resource, reader.roce_prefix)
    out = []
    for obj in nodes:
        name = _str(_dict(obj.get("metadata")).get("name"))
        if name:
            out.append(reader.read(cast(Node, obj), _gpus_of(bound.get(name, ()), names)))
    return out


def _gpus_of(pods: Iterable[Mapping[str, Any]], names: GpuResources) -> int:
    """The GPUs ``pods`` request (a pod whose GPU quantity cannot be read counts none)."""
    used = 0
    for pod in pods:
        try:
            used += pod_gpus(_dict(pod.get("spec")), names)
        except ValueError:
            continue
    return used


class Migrator:
    """One round of step 5 against the API server, through an unmodified ``kubernetes`` client."""

    def __init__(
        self,
        api_client: Any,
        nodes: Callable[[], Sequence[NodeFacts]],
        *,
        clock: Callable[[], float],
        settings: MigratorSettings | None = None,
    ) -> None:
        from kubernetes import client as k8s

        self._api: Any = k8s.CoreV1Api(api_client)
        self._nodes = nodes
        self._clock = clock
        self.settings = settings or MigratorSettings()

    def _running_pods(self) -> list[dict[str, Any]]:
        response = self._api.list_pod_for_all_namespaces(
            field_selector="status.phase=Running", limit=MAX_PODS, _preload_content=False
        )
        items = json.loads(response.data).get("items") or []
        return [p for p in items if isinstance(p, dict)]

    def plan(self) -> tuple[list[Migration], dict[str, list[_Pod]]]:
        now = self._clock()
        facts = {f.name: f for f in self._nodes()}
        jobs, members = running_jobs(self._running_pods(), facts, self.settings, now=now)
        free = {name: len(f.free_gpus or ()) for name, f in facts.items() if f.free_gpus}
        s = self.settings

        def bandwidth_of(job: RunningJob, allocation: tuple[tuple[str, int], ...]) -> float:
            node, count = allocation[0]
            f = facts[node]
            found = pod_bandwidth(f.topology, f.free_gpus, count, 1)
            return found[0] if found is not None else DEFAULT_BANDWIDTHS.sys

        def cost_of(job: RunningJob, allocation: tuple[tuple[str, int], ...]) -> float:
            inventory = facts[allocation[0][0]].inventory
            held = inventory.datasets if inventory is not None else {}
            refetch = 0
            for name in {d for p in members[job.name] for d in p.datasets}:
                holding = held.get(name)
                if holding is None or not holding.ready:
                    refetch += 10**12  # size unknown to the extender: a terabyte, so moves rarely pay
                    if holding is not None and holding.size_bytes:
                        refetch += holding.size_bytes - 10**12
            return s.checkpoint_s + s.restart_s + refetch / s.fetch_bps

        moves = plan_migrations(jobs, free, bandwidth_of, cost_of, now=now, min_gain=s.min_gain)
        return moves, members

    def run_once(self) -> list[Migration]:
        """Plan one round and evict the pods of every job that moves; the moves done."""
        moves, members = self.plan()
        done = []
        for move in moves:
            evicted = 0
            for pod in members[move.job]:
                refused = evict(self._api, pod.namespace, pod.name)
                if refused is not None:
                    log.warning(
                        "migrate %s: eviction of %s/%s refused (%s)", move.job, pod.namespace, pod.name, refused
                    )
                    break
                evicted += 1
            if evicted:
                log.info(
                    "migrate %s to %s: %d pods evicted, expected end in %.0f s",
                    move.job,
                    move.target,
                    evicted,
                    move.end - self._clock(),
                )
                done.append(move)
        return done


class MigrationPass:
    """The controller's migration step: the node reader made once, a :class:`Migrator` per pass."""

    def __init__(self, api_client: Any, *, gpu_resource: str, class_prefix: str, clock: Callable[[], float]) -> None:
        self.api_client, self.clock = api_client, clock
        self.settings = MigratorSettings(gpu_resource=gpu_resource, class_prefix=f"{class_prefix}/{CLASS_STEM}")
        self._node_reader: NodeReader | None = None

    def run(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[Migration]:
        """The moves made this pass."""
        if self._node_reader is None:
            self._node_reader = NodeReader(
                gpu_resource=self.settings.gpu_resource, roce_prefix=self.settings.class_prefix
            )
        facts = node_facts(nodes, bound_pods(pods), self._node_reader)
        return Migrator(self.api_client, lambda: facts, clock=self.clock, settings=self.settings).run_once()


__all__ = ["MigrationPass", "Migrator", "MigratorSettings", "bound_pods", "node_facts", "running_jobs"]
