"""Runs the scores and the filter over the candidate nodes and combines the results.

The one coordinator of a scheduling decision: it reads the pod once, fetches each
score's inputs from :class:`~scheduler_plugin.nodeinfo.NodeFacts`, calls the pure
functions in :mod:`scheduler_plugin.plugins`, resolves the job's RoCE class (with
:class:`~scheduler_plugin.jobs.JobClasses`) and combines the normalized scores with the
configured weights. The HTTP app calls it; it knows nothing of HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_plugin import filter as node_filter
from scheduler_plugin.jobs import JobClasses
from scheduler_plugin.nodeinfo import NodeFacts
from scheduler_plugin.plugins import MAX, dataset, numa, roce
from scheduler_plugin.podspec import PodRequest, read_pod
from scheduler_plugin.settings import Settings, Weights
from scheduler_plugin.wire import Pod

log = logging.getLogger(__name__)

SCORES = ("dataset", "roce", "numa")
Cluster = Callable[[], Iterable[NodeFacts]]


@dataclass(frozen=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def combine(weights: Weights, dataset_scores: Sequence[int], roce_scores: Sequence[int],
            numa_scores: Sequence[int]) -> list[int]:
    """Weighted sum of the normalized scores, rounded and clamped to 0..10."""
    wd, wr, wn = weights.dataset, weights.roce, weights.numa
    out = []
    for d, r, n in zip(dataset_scores, roce_scores, numa_scores):
        total = int(wd * d + wr * r + wn * n + 0.5)
        out.append(MAX if total > MAX else 0 if total < 0 else total)
    return out


class Framework:
    """Scores and filters candidate nodes for one pod at a time. Thread-safe."""

    def __init__(self, settings: Settings, *, jobs: JobClasses | None = None) -> None:
        self.settings = settings
        self.jobs = jobs if jobs is not None else JobClasses(settings.job_ttl_s)
        self.placements = numa.PlacementMemo()

    def read_pod(self, pod: Pod) -> PodRequest:
        """The pod's request, with a log line when its data cannot be read."""
        s = self.settings
        request = read_pod(pod, job_labels=s.job_labels, gpu_resource=s.gpu_resource,
                           roce_prefix=s.roce_resource_prefix)
        for problem in (request.datasets_error, request.gpus_error):
            if problem:
                log.warning("pod %s: %s; scoring it as unparseable", request.key, problem)
        return request

    def prioritize(self, pod: PodRequest, nodes: Sequence[NodeFacts | None], cluster: Cluster,
                   which: str = "combined") -> list[int]:
        """0..10 per node, for one score (``dataset``, ``roce``, ``numa``) or ``combined``."""
        if which == "dataset":
            return self.dataset_scores(pod, nodes)
        if which == "roce":
            return self.roce_scores(pod, nodes, cluster)
        if which == "numa":
            return self.numa_scores(pod, nodes)
        w = self.settings.weights
        zeros = [0] * len(nodes)
        roce_scores, numa_scores = self.gpu_scores(pod, nodes, cluster) if w.roce or w.numa else (zeros, zeros)
        return combine(w, self.dataset_scores(pod, nodes) if w.dataset else zeros, roce_scores, numa_scores)

    def dataset_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        if pod.datasets_error or not pod.datasets:
            return [0] * len(nodes)
        wants = pod.datasets
        sizes = None
        if self.settings.partial_datasets:
            sizes = dataset.requested_sizes(wants, (n.inventory for n in nodes if n is not None))
        affinity = dataset.affinity
        if sizes is None:
            # Without partial credit a node lacking the first dataset scores 0: skip the
            # call for the many nodes that do not hold it.
            first = wants[0].name
            return dataset.normalize([
                affinity(wants, inv) if n is not None and (inv := n.inventory) is not None and first in inv.datasets
                else 0.0
                for n in nodes
            ])
        return dataset.normalize(
            [affinity(wants, n.inventory, sizes=sizes) if n is not None else 0.0 for n in nodes]
        )

    def roce_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None], cluster: Cluster) -> list[int]:
        return self.gpu_scores(pod, nodes, cluster, numa_too=False)[0]

    def numa_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        return self.gpu_scores(pod, nodes, lambda: (), roce_too=False)[1]

    def gpu_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None], cluster: Cluster, *,
                   roce_too: bool = True, numa_too: bool = True) -> tuple[list[int], list[int]]:
        """(RoCE, NUMA) scores in one pass: both depend only on a node's GPU key
        (topology, free set), so each distinct key is computed once per request."""
        need = pod.gpus
        if need <= 0 or pod.gpus_error:
            return [0] * len(nodes), [0] * len(nodes)
        gpu_class = self.job_class(pod, cluster) if roce_too else None
        placement = self.placements.score
        memo: dict[tuple[int, frozenset[int] | None, int], tuple[float, int]] = {}
        fits: list[float] = []
        placements: list[int] = []
        for node in nodes:
            if node is None:
                fits.append(0.0)
                placements.append(0)
                continue
            key = node.gpu_key
            found = memo.get(key)
            if found is None:
                found = memo[key] = (
                    _node_fit(node, gpu_class, need) if roce_too else 0.0,
                    placement(node.topology, node.topology_id, node.free_gpus, need) if numa_too else 0,
                )
            fits.append(found[0])
            placements.append(found[1])
        return roce.normalize(fits), placements

    def job_class(self, pod: PodRequest, cluster: Cluster) -> str | None:
        """The RoCE class this pod's GPUs should come from, or None for "any class".

        A class the pod requests as a resource is a fact; otherwise the job's remembered
        class; otherwise, for the first worker of a job, the cluster-wide choice,
        remembered for the job's later workers. A pod in no job has no peers to share a
        subnet with: any class (its best fit on each node) will do.
        """
        if pod.gpu_class is not None:
            if pod.job is not None:
                self.jobs.remember(pod.job, pod.gpu_class)
            return pod.gpu_class
        if pod.job is None:
            return None
        known = self.jobs.get(pod.job)
        if known is not None:
            return known
        choice = roce.choose_class_grouped(_grouped_free_by_class(cluster()), pod.gpus)
        if choice is None:
            return None
        chosen = self.jobs.remember(pod.job, choice.name)
        log.info("job %s: RoCE class %s (votes %s)", pod.job, chosen, dict(choice.votes))
        return chosen

    def filter(self, pod: PodRequest, names: Sequence[str], nodes: Sequence[NodeFacts | None]) -> FilterOutcome:
        """Hard facts only; unknown nodes pass."""
        sizes = dataset.requested_sizes(pod.datasets, (n.inventory for n in nodes if n is not None))
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for name, node in zip(names, nodes):
            failure = node_filter.check(pod, node, sizes)
            if failure is None:
                passed.append(name)
            elif failure.unresolvable:
                unresolvable[name] = failure.reason
            else:
                failed[name] = failure.reason
        return FilterOutcome(passed, failed, unresolvable)


def _grouped_free_by_class(nodes: Iterable[NodeFacts]) -> list[tuple[dict[str, int], int]]:
    """(free_by_class, node count) per distinct GPU key, for the cluster-wide vote."""
    groups: dict[tuple[int, frozenset[int] | None, int], list[Any]] = {}
    for node in nodes:
        group = groups.get(node.gpu_key)
        if group is None:
            groups[node.gpu_key] = [node.free_by_class, 1]
        else:
            group[1] += 1
    return [(free, count) for free, count in groups.values() if free]


def _node_fit(node: NodeFacts, gpu_class: str | None, need: int) -> float:
    """Best-fit raw score of one node: in the job's class when it has one, else in the
    node's best-fitting class, else over the whole node (pods larger than any class)."""
    by_class = node.free_by_class
    sizes = node.class_sizes
    if gpu_class is not None and by_class:
        if gpu_class not in by_class:
            return 0.0
        if need <= sizes[gpu_class]:
            return roce.fit(by_class[gpu_class], need)
    elif by_class and need <= max(sizes.values()):
        return max(roce.fit(free, need) for free in by_class.values())
    return roce.fit(node.free_count, need)


__all__ = ["SCORES", "Cluster", "FilterOutcome", "Framework", "combine"]
