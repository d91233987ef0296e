"""How many ready copies of a dataset the cluster should keep, and where: pure functions
(docs/design.md#replication).

Who calls it: the Dataset controller (:mod:`dsagent.controller.warmup`) for Datasets with
``spec.replicas`` (``auto`` or a number); it gathers the demand and the nodes and asks the
chosen nodes' agents to hold a copy (task ``replica.<namespace>.<name>``).

Decisions:

- **Demand** = the pods that want the dataset now or did lately: pending pods naming it
  plus pods naming it that started within the demand window (running or finished). Each
  such pod could run on its own node, so it is the number of copies that could be hit.
- **Target**: ``auto`` follows the demand, capped (``max_auto``) and never above the
  nodes that can hold a copy; it falls when the demand falls, and at zero demand the
  controller holds no copy (the ones cached stay, as any unused data, evictable). A
  number is taken as given (capped by the eligible nodes).
- **Where**: nodes already holding it ready first (no transfer), then those already
  chosen (no flapping: they stay eligible while their copy arrives), then nodes with
  **room** (free cache bytes at least the eviction rule's ``ratio x size``, so warming
  evicts nothing) and **free GPUs** (a pod can run there), most free GPUs first, then most
  free bytes, then by name. A node with neither a copy nor room and free GPUs is not chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dsagent.policy.eviction import EVICT_RATIO, needed_bytes

AUTO = "auto"


@dataclass(frozen=True)
class NodeRoom:
    """One node as replication sees it."""

    name: str
    holds_ready: bool
    free_bytes: int
    free_gpus: int


def parse_mode(value: object) -> str | int | None:
    """``spec.replicas``: ``"auto"``, a non-negative integer (at most 10,000), or None (off)."""
    if value == AUTO:
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10_000:
        return value
    return None


def target(mode: str | int, demand: int, *, max_auto: int) -> int:
    """Copies wanted: the demand (capped) under ``auto``, else the number given."""
    if mode == AUTO:
        return max(0, min(max_auto, demand))
    return max(0, int(mode))


def choose(
    nodes: Sequence[NodeRoom],
    wanted: int,
    *,
    size_bytes: int,
    before: Sequence[str] = (),
    ratio: float = EVICT_RATIO,
    admit: Callable[[str], bool] | None = None,
) -> list[str]:
    """The ``wanted`` nodes to hold a copy (fewer when fewer qualify), sorted by name.
    ``admit``: asked in rank order for each eligible node until ``wanted`` are admitted (the
    controller's tenancy bounds, docs/operator-guide/tenancy.md); a node it refuses is skipped."""
    need = needed_bytes(max(0, size_bytes), ratio)
    kept = set(before)

    def eligible(n: NodeRoom) -> bool:  # a node chosen before stays eligible while its copy arrives
        return n.holds_ready or n.name in kept or (n.free_bytes >= need and n.free_gpus > 0)

    def rank(n: NodeRoom) -> tuple[int, int, int, int, str]:
        return (0 if n.holds_ready else 1, 0 if n.name in kept else 1, -n.free_gpus, -n.free_bytes, n.name)

    ranked = sorted((n for n in nodes if eligible(n)), key=rank)
    picked: list[str] = []
    for node in ranked:
        if len(picked) >= wanted:
            break
        if admit is None or admit(node.name):
            picked.append(node.name)
    return sorted(picked)


__all__ = ["AUTO", "NodeRoom", "choose", "parse_mode", "target"]
