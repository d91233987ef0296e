"""The two schedulers users run instead of ours, as the simulator emulates them.

Who calls it: :mod:`tools.sim.engine`, for the ``default`` and ``fluid`` policies. These
are the only scores in the simulator that are not the product's, because they are not
ours to call:

- ``least_allocated``: kube-scheduler's default ``NodeResourcesFit`` LeastAllocated
  strategy on GPUs, ``10 x free / allocatable``, which spreads pods over nodes;
- ``fluid``: Fluid-style data affinity: a preferred node affinity for nodes *labelled* as
  holding the dataset (the name only: any cached copy, no digest; a label stays after
  the copy is evicted), worth more than the spreading score. The "holds it" part is the
  project's own dataset affinity (``scheduler_plugin.plugins.dataset``) fed with the
  labels in place of an inventory, so that only the label semantics differ.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_plugin.plugins import dataset
from scheduling.nodeinfo import NodeFacts
from scheduling.podspec import PodRequest

FLUID_AFFINITY_WEIGHT = 2  # preferred affinity outweighs spreading, as a weight-100 term does


def least_allocated(nodes: Sequence[NodeFacts]) -> list[int]:
    return [int(10 * n.free_count / n.allocatable_gpus) if n.allocatable_gpus else 0 for n in nodes]


def fluid(pod: PodRequest, nodes: Sequence[NodeFacts]) -> list[int]:
    spread = least_allocated(nodes)
    held = dataset.normalize([dataset.affinity(pod.datasets, n.inventory) for n in nodes])
    return [FLUID_AFFINITY_WEIGHT * h + s for h, s in zip(held, spread)]


__all__ = ["FLUID_AFFINITY_WEIGHT", "fluid", "least_allocated"]
