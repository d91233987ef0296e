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

:func:`choose` says it over a list of rooms; :class:`Ranked` and :func:`choose_ranked` give
the same answer when many Datasets choose among the same nodes: the rooms are ranked once
(per controller pass) and each Dataset walks that order only as far as it picks, instead of
sorting every node for each Dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

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
    controller's tenancy bounds, docs/operator-guide/tenancy.md); a node it refuses is skipped.
    :func:`choose_ranked` gives the same answer over rooms ranked once for many Datasets."""
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


def _room_rank(n: NodeRoom) -> tuple[int, int, str]:
    return (-n.free_gpus, -n.free_bytes, n.name)


class Ranked:
    """Every node's room (``holds_ready`` is not read: that is each Dataset's own), and those
    with a free GPU in the order :func:`choose` ranks the nodes with room (most free GPUs,
    then most free bytes, then by name): built once for many Datasets."""

    def __init__(self, rooms: Iterable[NodeRoom]) -> None:
        self.rooms: dict[str, NodeRoom] = {}
        for room in rooms:
            self.rooms.setdefault(room.name, room)
        ordered = sorted((r for r in self.rooms.values() if r.free_gpus > 0), key=_room_rank)
        # one run per count of free GPUs, most first; within a run most free bytes first
        self._runs: list[list[NodeRoom]] = []
        for room in ordered:
            if not self._runs or self._runs[-1][0].free_gpus != room.free_gpus:
                self._runs.append([])
            self._runs[-1].append(room)

    def with_room(self, need: int) -> Iterator[NodeRoom]:
        """The nodes with at least ``need`` free bytes and a free GPU, in rank order, lazily: each
        run is left at its first node with too few bytes (the rest of the run has fewer)."""
        for run in self._runs:
            for room in run:
                if room.free_bytes < need:
                    break
                yield room


def choose_ranked(
    ranked: Ranked,
    holding: Collection[str],
    wanted: int,
    *,
    size_bytes: int,
    before: Sequence[str] = (),
    ratio: float = EVICT_RATIO,
    admit: Callable[[str], bool] | None = None,
    closed: Callable[[], bool] | None = None,
) -> list[str]:
    """:func:`choose` over ``ranked``'s rooms, with ``holding`` the nodes holding a ready copy
    (names without a room are not candidates): the same nodes, reading only as many rooms as
    it picks from. ``closed``, asked after ``admit`` refused a node: True when ``admit`` would
    refuse every other node too (a bound no node can pass), which ends the walk; ``admit``'s
    answers are unchanged by it."""
    if wanted <= 0:
        return []
    need = needed_bytes(max(0, size_bytes), ratio)
    kept = set(before)
    rooms = ranked.rooms
    holders = {name for name in holding if name in rooms}
    firsts = sorted(
        (rooms[name] for name in holders), key=lambda n: (0 if n.name in kept else 1, *_room_rank(n))
    )  # a copy: no transfer
    seconds = sorted((rooms[name] for name in kept if name in rooms and name not in holders), key=_room_rank)
    rest = (n for n in ranked.with_room(need) if n.name not in holders and n.name not in kept)
    picked: list[str] = []
    for node in chain(firsts, seconds, rest):
        if admit is None or admit(node.name):
            picked.append(node.name)
            if len(picked) >= wanted:
                break
        elif closed is not None and closed():
            break
    return sorted(picked)


__all__ = ["AUTO", "NodeRoom", "Ranked", "choose", "choose_ranked", "parse_mode", "target"]
