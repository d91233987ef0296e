"""The filter: only hard facts, each with a reason; dataset affinity only when a pod requires it.

A node fails when

- the pod needs more GPUs (of its RoCE class, when it requests one) than the node has
  free: preemption could free them, so it goes to ``FailedNodes``;
- the pod requests a RoCE class the node does not have, or a dataset larger than the
  node's whole cache that the node does not already hold: nothing can change that, so
  it goes to ``FailedAndUnresolvableNodes``.
- the pod is a worker of a multi-worker job whose class set (docs/design.md#class-sets)
  the node's class layout cannot serve (unresolvable), or can serve but not with its
  free GPUs now (resolvable): :func:`class_set`, called by the framework, which knows
  the job's set.

- a job queued ahead of the pod waits for whole nodes (:class:`Waiting`, the pods of
  multi-worker jobs kube-scheduler could not place): a node with every GPU free that the
  pod would leave too small for one of that job's pods is kept whole, in ``FailedNodes``,
  while kube-scheduler offers the pod another node (:func:`kept_whole`, called by the
  framework, which sees every candidate): a smaller job behind a wide one takes the nodes
  with GPUs in use, or waits, rather than break up the whole nodes the wide job needs
  (docs/design.md#whole-nodes). A node the waiting job's pods may not use (their node
  selector, required node affinity or tolerations rule it out) is kept for it by no one.
- the pod opts in to *required* dataset affinity (``dsagent.io/dataset-affinity: required``)
  and the node does not hold the current version of one of its datasets ready (a node
  without an inventory holds nothing): ``FailedAndUnresolvableNodes``, since preemption
  cannot cache data (warm-up can: ``spec.warm`` of the Dataset).

A node the extender knows nothing about, or whose GPU facts are unknown, passes.
Called by the framework.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gpu_topology.classsets import assign, set_key
from scheduler_plugin.plugins.dataset import is_current
from scheduling.nodeinfo import NodeFacts
from scheduling.podspec import PodRequest


@dataclass(frozen=True)
class Failure:
    """Why a node cannot take the pod; ``unresolvable`` when preemption cannot help."""

    reason: str
    unresolvable: bool = False


def check(pod: PodRequest, node: NodeFacts | None, sizes: Mapping[str, int]) -> Failure | None:
    """The first hard fact that rules ``node`` out for ``pod``, or None."""
    if node is None:
        return None
    return _gpus(pod, node) or _datasets(pod, node, sizes) or _required(pod, node)


def _required(pod: PodRequest, node: NodeFacts) -> Failure | None:
    if not pod.affinity_required:
        return None
    held = node.inventory.datasets if node.inventory is not None else {}
    for want in pod.datasets:
        holding = held.get(want.name)
        if holding is None or not holding.ready or not is_current(want, holding):
            version = f" {want.digest[:12]}" if want.digest else ""
            return Failure(
                f"pod requires dataset {want.name}{version} cached and this node does not hold it ready", True
            )
    return None


def class_set(pod: PodRequest, node: NodeFacts, classes: tuple[str, ...]) -> Failure | None:
    """Why ``node`` cannot take a worker of ``pod``'s job in the job's class set, or None.
    A node without classes, or whose free GPUs are unknown, passes (nothing is known)."""
    if not classes or not node.classes or node.free_gpus is None or pod.gpus <= 0:
        return None
    key = set_key(classes)
    if assign(node.class_sizes, classes, pod.gpus) is None:
        layout = ", ".join(f"{name}:{size}" for name, size in node.class_sizes.items())
        return Failure(
            f"node's class layout ({layout}) cannot serve the job's class set {key} with {pod.gpus} GPUs", True
        )
    if assign(node.free_by_class, classes, pod.gpus) is None:
        free = ", ".join(f"{name}:{node.free_by_class.get(name, 0)}" for name in classes)
        return Failure(f"free GPUs in the job's class set {key} ({free}) cannot take {pod.gpus}")
    return None


@dataclass(frozen=True)
class Waiting:
    """The pods of multi-worker jobs that kube-scheduler tried and could not place
    (``PodScheduled`` False, ``Unschedulable``), by job: the most GPUs one of the job's
    waiting pods asks, and the job's place in kube-scheduler's queue, ``(-priority,
    created)`` of its first pod (the queue's default order: priority, then age); and, where
    known (the watch cache's), the placement keys of the nodes its pods may use, as
    :attr:`NodeFacts.placement` holds them (the cache's number for each key of
    :mod:`scheduling.nodefit`: node selector, required node affinity, taints, cordons): a
    node no pod of the job may use is kept for it by no one. A job not in ``nodes`` may use
    any node."""

    jobs: Mapping[str, tuple[int, tuple[int, float]]] = field(default_factory=dict)
    nodes: Mapping[str, frozenset[object]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, pods: Iterable[tuple[str, int, tuple[int, float]]], nodes: Mapping[str, frozenset[object]] | None = None
    ) -> Waiting:
        """From ``(job, GPUs, queue place)`` per waiting pod, and the placement keys each
        job's pods may use (``nodes``; a job left out: any)."""
        jobs: dict[str, tuple[int, tuple[int, float]]] = {}
        for job, gpus, place in pods:
            held = jobs.get(job)
            jobs[job] = (gpus, place) if held is None else (max(held[0], gpus), min(held[1], place))
        return cls(jobs, dict(nodes or {}))

    def ahead_of(self, job: str, place: tuple[int, float]) -> frozenset[Ask]:
        """What the waiting jobs other than ``job`` ahead of ``place`` in the queue ask."""
        return frozenset(
            Ask(gpus, self.nodes.get(other)) for other, (gpus, at) in self.jobs.items() if at < place and other != job
        )


class Ask(NamedTuple):
    """A waiting job's pods' GPU ask, and the placement keys of the nodes they may use
    (None: any node)."""

    gpus: int
    nodes: frozenset[object] | None = None


#: no pod waiting (the extender without its watch cache sees none)
NO_WAITING = Waiting()


def whole_free(node: NodeFacts) -> int:
    """The node's GPU count when every one of them is free, else 0 (0 too when unknown)."""
    if not node.gpu_facts_known:
        return 0
    total = node.allocatable_gpus or (len(node.topology.gpus) if node.topology is not None else 0)
    return total if total > 0 and node.free_count >= total else 0


def kept_whole(pod: PodRequest, node: NodeFacts, asks: Iterable[Ask]) -> Failure | None:
    """Why ``node`` is kept whole for the waiting jobs ahead of ``pod`` (``asks``), or None:
    every GPU of the node is free, and ``pod`` on it would leave fewer than one of those
    jobs' pods asks, where the whole node would do and that job's pods may use the node.
    The framework applies it only while kube-scheduler offers the pod another node."""
    if pod.gpus <= 0:
        return None
    total = whole_free(node)
    if not total or pod.gpus >= total:
        return None
    left = total - pod.gpus
    waiting = [
        ask.gpus
        for ask in asks
        if left < ask.gpus <= total and (ask.nodes is None or node.placement in ask.nodes)
    ]  # fmt: skip
    if not waiting:
        return None
    return Failure(
        f"node kept whole: every GPU free, and a job queued ahead of this pod waits for {max(waiting)} GPUs on one node"
    )


def _gpus(pod: PodRequest, node: NodeFacts) -> Failure | None:
    if pod.gpus <= 0:
        return None
    if len(pod.gpu_classes) > 1:
        return class_set(pod, node, pod.gpu_classes) or _plain(pod, node)
    if pod.gpu_class is not None and node.classes and node.free_gpus is not None:
        if pod.gpu_class not in node.class_sizes:
            names = ", ".join(c.name for c in node.classes)
            return Failure(f"node has no GPU-RoCE class {pod.gpu_class} (it has {names})", True)
        free = node.free_by_class.get(pod.gpu_class, 0)
        if free < pod.gpus:
            return Failure(f"{free} free GPUs in class {pod.gpu_class}, pod needs {pod.gpus}")
        return None
    return _plain(pod, node)


def _plain(pod: PodRequest, node: NodeFacts) -> Failure | None:
    if node.gpu_facts_known and node.free_count < pod.gpus:
        return Failure(f"{node.free_count} free GPUs, pod needs {pod.gpus}")
    return None


def _datasets(pod: PodRequest, node: NodeFacts, sizes: Mapping[str, int]) -> Failure | None:
    inventory = node.inventory
    if inventory is None or inventory.capacity_bytes is None:
        return None
    for want in pod.datasets:
        size = sizes.get(want.name)
        if size is None or size <= inventory.capacity_bytes:
            continue
        holding = inventory.datasets.get(want.name)
        if holding is not None and holding.ready and is_current(want, holding):
            continue
        return Failure(
            f"dataset {want.name} ({_human(size)}) is larger than the node's whole cache "
            f"({_human(inventory.capacity_bytes)})",
            True,
        )
    return None


def _human(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


__all__ = ["NO_WAITING", "Ask", "Failure", "Waiting", "check", "class_set", "kept_whole", "whole_free"]
