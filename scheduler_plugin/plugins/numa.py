"""NUMA placement: how good a GPU set the node can still give the pod (docs/design.md#numa-placement).

The score compares the best set gpu_topology's ``best_gpu_set`` finds among the node's
free GPUs with the best set the same hardware could give when fully free, and puts
every node that can keep the pod's GPUs on one NUMA node with a nearby NIC above every
node that cannot:

- one NUMA node with a nearby NIC: ``6 + round(4 x ratio)``  (6..10)
- otherwise:                       ``1 + round(4 x ratio)``  (1..5)
- too few free GPUs, no topology, or no GPUs requested: 0

where ``ratio = best score on the free GPUs / best score possible for that count``.
The score is absolute (10 = as good as this hardware allows), so it needs no
normalization over the candidates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpu_topology import Topology
from scheduling.nodeinfo import placed_sets

log = logging.getLogger(__name__)

# NIC-to-GPU links that do not leave the GPU's PCIe host bridge (nvidia-smi's legend).
NEAR_NIC_LEVELS = frozenset({"PIX", "PXB", "PHB"})


def placement(topology: Topology | None, free: Iterable[int] | None, need: int) -> int:
    """The 0..10 NUMA score of one node for a pod needing ``need`` GPUs."""
    if topology is None or free is None or need <= 0:
        return 0
    placed = placed_sets(topology, free, need)
    if placed is None:
        return 0
    best, ideal = placed
    ratio = 1.0 if ideal is None or ideal.score <= 0 else min(1.0, max(0.0, best.score / ideal.score))
    near = best.single_numa and best.nic_level in NEAR_NIC_LEVELS
    return (6 if near else 1) + round(4 * ratio)


class PlacementMemo:
    """Memoizes :func:`placement` by (topology id, free set, need): a cluster has few
    distinct topologies and free sets, and ``best_gpu_set`` is combinatorial."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._memo: dict[tuple[int, frozenset[int], int], int] = {}

    def score(self, topology: Topology | None, topology_id: int, free: frozenset[int] | None, need: int) -> int:
        if topology is None or free is None or need <= 0:
            return 0
        key = (topology_id, free, need)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= self.limit:
                self._memo.clear()
            found = self._memo[key] = placement(topology, free, need)
        return found


__all__ = ["NEAR_NIC_LEVELS", "PlacementMemo", "placement"]
