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
    return [
        min(MAX, max(0, int(wd * d + wr * r + wn * n + 0.5)))
        for d, r, n in zip(dataset_scores, roce_scores, numa_scores)
    ]


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
        return combine(
            w,
            self.dataset_scores(pod, nodes) if w.dataset else zeros,
            self.roce_scores(pod, nodes, cluster) if w.roce else zeros,
            self.numa_scores(pod, nodes) if w.numa else zeros,
        )

    def dataset_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        if pod.datasets_error or not pod.datasets:
            return [0] * len(nodes)
        wants = pod.datasets
        sizes = None
        if self.settings.partial_datasets:
            sizes = dataset.requested_sizes(wants, (n.inventory for n in nodes if n is not None))
        affinity = dataset.affinity
        return dataset.normalize(
            [affinity(wants, n.inventory, sizes=sizes) if n is not None else 0.0 for n in nodes]
        )

    def roce_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None], cluster: Cluster) -> list[int]:
        need = pod.gpus
        if need <= 0 or pod.gpus_error:
            return [0] * len(nodes)
        gpu_class = self.job_class(pod, cluster)
        return roce.normalize([_node_fit(n, gpu_class, need) if n is not None else 0.0 for n in nodes])

    def numa_scores(self, pod: PodRequest, nodes: Sequence[NodeFacts | None]) -> list[int]:
        need = pod.gpus
        if need <= 0 or pod.gpus_error:
            return [0] * len(nodes)
        score = self.placements.score
        return [score(n.topology, n.topology_id, n.free_gpus, need) if n is not None else 0 for n in nodes]

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
        choice = roce.choose_class((n.free_by_class for n in cluster() if n.free_by_class), pod.gpus)
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
