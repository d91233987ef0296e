"""GPU-pair and GPU-set scores, and the choice of the best GPU set on a node.

Pure functions of a :class:`~gpu_topology.model.Topology`; the scheduler extender and
``dsctl topo best`` call them. The pair scores are NVIDIA go-gpuallocator's (docs/design.md#gpu-pair-scores; the design's
"Table 3" rule): NVLink 100 per bonded link, same board 60, one PCIe switch (PIX) 50,
several switches (PXB) 40, a host bridge (PHB) 30, the same NUMA node (NODE) 20, across
CPUs (SYS) 10; an unknown link scores 0. A set scores the sum of its pairs.

:func:`best_gpu_set` is exact (it enumerates every candidate set) whenever there are at
most :data:`EXACT_FREE_GPUS` free GPUs or at most :data:`EXACT_COMBINATIONS` sets to
try. Beyond that it runs a greedy construction from every possible first GPU, then
improves the best result by single swaps (one member out, one non-member in) until no
swap helps. Among sets of equal score it prefers, in order: all GPUs on one NUMA node,
the closest NIC (PIX, then PXB, PHB, NODE, SYS), then the lowest GPU indices.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_topology.errors import InvalidTopology
from gpu_topology.model import PCIE_ORDER, Link, LinkKind, Topology, gpu_name

NVLINK_SCORE = 100
LINK_SCORES: dict[LinkKind, int] = {
    LinkKind.BOARD: 60,
    LinkKind.PIX: 50,
    LinkKind.PXB: 40,
    LinkKind.PHB: 30,
    LinkKind.NODE: 20,
    LinkKind.SYS: 10,
}
EXACT_FREE_GPUS = 8
EXACT_COMBINATIONS = 5_000


def link_score(link: Link | None) -> int:
    """The go-gpuallocator score of one GPU-GPU link (0 when unknown or self)."""
    if link is None:
        return 0
    if link.kind is LinkKind.NVLINK:
        return NVLINK_SCORE * link.nvlinks
    return LINK_SCORES.get(link.kind, 0)


def pair_score(topology: Topology, a: int, b: int) -> int:
    """The score of GPUs ``a`` and ``b``; 0 for a GPU with itself."""
    topology.gpu(a), topology.gpu(b)  # unknown indices raise UnknownDevice
    if a == b:
        return 0
    return link_score(topology.link(gpu_name(a), gpu_name(b)))


def set_score(topology: Topology, gpus: Iterable[int]) -> int:
    """The sum of the pair scores of every pair in ``gpus`` (duplicates ignored)."""
    members = sorted(set(gpus))
    return sum(pair_score(topology, a, b) for a, b in itertools.combinations(members, 2))


@dataclass(frozen=True)
class GpuSet:
    """A chosen GPU set with what made it win."""

    gpus: tuple[int, ...]
    score: int
    single_numa: bool  # every GPU is known to sit on the same NUMA node
    nic_level: str | None  # the closest link from any member to any NIC ("PIX" ...)


def nic_level(topology: Topology, gpus: Iterable[int]) -> str | None:
    """The closest PCIe level from any of ``gpus`` to any usable NIC, or None."""
    best = _nic_rank(topology, gpus)
    return None if best is None else PCIE_ORDER[best].value


def single_numa(topology: Topology, gpus: Iterable[int]) -> bool:
    """True when every GPU's NUMA node (or, unknown, its CPU list) is known and shared."""
    places = {topology.gpu(i).locality for i in gpus}
    return len(places) == 1 and None not in places


def best_gpu_set(
    topology: Topology,
    free: Iterable[int],
    count: int,
    must_include: Iterable[int] = (),
) -> GpuSet | None:
    """The best-scoring set of ``count`` GPUs from ``free`` that holds ``must_include``.

    Returns None when no such set exists (too few free GPUs, or a must-include GPU that
    is not free). Raises :class:`~gpu_topology.errors.UnknownDevice` for indices the
    topology lacks and :class:`~gpu_topology.errors.InvalidTopology` for a negative count.
    """
    free_set = set(free)
    must = set(must_include)
    for index in sorted(free_set | must):
        topology.gpu(index)
    if count < 0:
        raise InvalidTopology(f"cannot choose {count} GPUs")
    if not must <= free_set or len(must) > count or count > len(free_set):
        return None
    chooser = _Chooser(topology)
    candidates = sorted(free_set - must)
    need = count - len(must)
    if len(candidates) <= EXACT_FREE_GPUS or math.comb(len(candidates), need) <= EXACT_COMBINATIONS:
        members = chooser.exact(sorted(must), candidates, need)
    else:
        members = chooser.local_search(sorted(must), candidates, need)
    return chooser.describe(members)


class _Chooser:
    """Scores and compares candidate sets over one topology, with cached pair scores."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._pairs: dict[tuple[int, int], int] = {}
        # Per-GPU facts, computed once: the key of every candidate set reuses them.
        self._place = {g.index: g.locality for g in topology.gpus}
        self._nic = {g.index: _nic_rank(topology, [g.index]) for g in topology.gpus}

    def pair(self, a: int, b: int) -> int:
        key = (a, b) if a < b else (b, a)
        if key not in self._pairs:
            self._pairs[key] = pair_score(self.topology, *key)
        return self._pairs[key]

    def score(self, members: Sequence[int]) -> int:
        return sum(self.pair(a, b) for a, b in itertools.combinations(members, 2))

    def key(self, members: Sequence[int]) -> tuple[int, bool, int]:
        places = {self._place[m] for m in members}
        one_node = len(places) == 1 and None not in places
        ranks = [r for r in (self._nic[m] for m in members) if r is not None]
        closeness = len(PCIE_ORDER) - min(ranks) if ranks else -1
        return (self.score(members), one_node, closeness)

    def exact(self, must: list[int], candidates: list[int], need: int) -> tuple[int, ...]:
        best: tuple[int, ...] = ()
        best_key: tuple[int, bool, int] | None = None
        # combinations() yields in lexicographic order and only a strictly better key
        # replaces the best, so ties go to the lowest indices.
        for extra in itertools.combinations(candidates, need):
            members = tuple(sorted(must + list(extra)))
            key = self.key(members)
            if best_key is None or key > best_key:
                best, best_key = members, key
        return best

    def local_search(self, must: list[int], candidates: list[int], need: int) -> tuple[int, ...]:
        if need == 0:
            return tuple(must)
        seeds = candidates if not must else [None]
        starts = [self._greedy(must, candidates, need, seed) for seed in seeds]
        best = max(starts, key=lambda m: (self.key(m), [-i for i in m]))
        return self._improve(best, set(must), candidates)

    def _greedy(
        self, must: list[int], candidates: list[int], need: int, seed: int | None
    ) -> tuple[int, ...]:
        chosen = list(must) + ([seed] if seed is not None else [])
        pool = [c for c in candidates if c not in chosen]
        while len(chosen) < len(must) + need:
            pick = max(pool, key=lambda c: (self.key(chosen + [c]), -c))
            chosen.append(pick)
            pool.remove(pick)
        return tuple(sorted(chosen))

    def _improve(self, members: tuple[int, ...], fixed: set[int], candidates: list[int]) -> tuple[int, ...]:
        current, current_key = members, self.key(members)
        improved = True
        while improved:
            improved = False
            for out in [m for m in current if m not in fixed]:
                for into in [c for c in candidates if c not in current]:
                    trial = tuple(sorted([m for m in current if m != out] + [into]))
                    trial_key = self.key(trial)
                    if trial_key > current_key:
                        current, current_key, improved = trial, trial_key, True
                        break
                if improved:
                    break
        return current

    def describe(self, members: tuple[int, ...]) -> GpuSet:
        return GpuSet(
            gpus=members,
            score=self.score(members),
            single_numa=single_numa(self.topology, members),
            nic_level=nic_level(self.topology, members),
        )


def _nic_rank(topology: Topology, gpus: Iterable[int]) -> int | None:
    """Index in PCIE_ORDER of the closest GPU-NIC link of ``gpus`` (lower is closer)."""
    best: int | None = None
    for index in gpus:
        for nic in topology.nics:
            if not nic.usable:
                continue
            link = topology.link(gpu_name(index), nic.name)
            if link is None or link.kind not in PCIE_ORDER:
                continue
            rank = PCIE_ORDER.index(link.kind)
            best = rank if best is None else min(best, rank)
    return best
