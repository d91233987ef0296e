"""kube-scheduler's own scores, as the simulator emulates them: the two schedulers users
run instead of ours, and the score our scheduler adds to the extender's.

Who calls it: :mod:`tools.sim.placement`, for every policy's node choice. These are the
only scores in the simulator that are not the product's, because they are not ours to call:

- ``least_allocated``: kube-scheduler's default ``NodeResourcesFit`` LeastAllocated
  strategy on GPUs, ``10 x free / allocatable``, which spreads pods over nodes;
- ``most_allocated``: ``NodeResourcesFit`` MostAllocated on GPUs, as the chart configures
  our scheduler (``scheduler.resourceScoring``): ``100 x (used + requested) / allocatable``,
  kube-scheduler's integer rule, which packs pods and keeps whole nodes for large workers;
- ``fluid``: Fluid-style data affinity: a preferred node affinity for nodes *labelled* as
  holding the dataset (the name only: any cached copy, no digest; a label stays after
  the copy is evicted), worth more than the spreading score. The "holds it" part is the
  project's own dataset affinity (``scheduler_plugin.plugins.dataset``) fed with the
  labels in place of an inventory, so that only the label semantics differ. With
  ``packed``, the same affinity over ``most_allocated`` in place of the spreading: Fluid
  under a kube-scheduler configured to pack as ours is, so that packing alone is not
  counted as ours' advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_plugin.plugins import dataset
from scheduling.nodeinfo import NodeFacts
from scheduling.podspec import PodRequest

FLUID_AFFINITY_WEIGHT = 2  # preferred affinity outweighs spreading, as a weight-100 term does
#: what the chart configures our scheduler with (``scheduler.extender.weight`` and
#: ``scheduler.resourceScoring.type``; a test holds them equal to ``values.yaml``)
EXTENDER_WEIGHT = 2
OUR_RESOURCE_SCORING = "MostAllocated"


def least_allocated(nodes: Sequence[NodeFacts]) -> list[int]:
    return [int(10 * n.free_count / n.allocatable_gpus) if n.allocatable_gpus else 0 for n in nodes]


def most_allocated(nodes: Sequence[NodeFacts], gpus: int) -> list[int]:
    """0..100 per node for a pod of ``gpus`` GPUs (the pod's request counted, as
    kube-scheduler's ``mostRequestedScore`` does)."""
    return [
        (100 * min(n.allocatable_gpus, n.allocatable_gpus - n.free_count + gpus)) // n.allocatable_gpus
        if n.allocatable_gpus
        else 0
        for n in nodes
    ]


def with_extender(extender: Sequence[int], fit: Sequence[int], weight: int = EXTENDER_WEIGHT) -> list[int]:
    """kube-scheduler's total of the extender's 0..10 (scaled to its 0..100, times the
    extender's weight) and one plugin's 0..100 at weight 1."""
    return [10 * weight * e + f for e, f in zip(extender, fit)]


def fluid(pod: PodRequest, nodes: Sequence[NodeFacts], *, packed: bool = False) -> list[int]:
    held = dataset.normalize([dataset.affinity(pod.datasets, n.inventory) for n in nodes])
    if packed:  # both on kube-scheduler's 0..100: the affinity term at plugin weight 2
        return [10 * FLUID_AFFINITY_WEIGHT * h + f for h, f in zip(held, most_allocated(nodes, pod.gpus))]
    spread = least_allocated(nodes)
    return [FLUID_AFFINITY_WEIGHT * h + s for h, s in zip(held, spread)]


__all__ = [
    "EXTENDER_WEIGHT",
    "FLUID_AFFINITY_WEIGHT",
    "OUR_RESOURCE_SCORING",
    "fluid",
    "least_allocated",
    "most_allocated",
    "with_extender",
]
