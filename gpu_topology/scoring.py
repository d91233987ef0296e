"""GPU-pair and GPU-set scores, and the choice of the best GPU set on a node.

Pure functions of a :class:`~gpu_topology.model.Topology`; the scheduler extender, the
node's device plugin and ``dsctl topo best`` call them. Design:
``docs/design.md#gpu-pair-scores``. Both the scores and the search follow NVIDIA
go-gpuallocator's best-effort policy (the allocator behind NVIDIA's device plugin):

* **Pair score** = the PCIe path's score + the NVLink score. PCIe: same board 60, one
  PCIe switch (PIX) 50, several switches (PXB) 40, a host bridge (PHB) 30, the same NUMA
  node (NODE) 20, across CPUs (SYS) 10, unknown 0. NVLink: 100 per bonded link, counted
  up to 18 links. An NVLinked pair therefore scores both (an A100 pair on one PCIe switch
  complex: 1200 + 40). ``nvidia-smi topo -m`` prints only the NVLink, so the PCIe level
  beneath it is taken from the link when a backend measured it (NVML, NCCL XML), else
  inferred by :func:`pcie_level`.
* **Set score** = the sum of its pairs' scores.
* **Best set**: among every partition of the free GPUs into sets of ``count`` (the last
  one padded when ``count`` does not divide them) that has an unpadded set holding every
  must-include GPU, take the highest-scoring partition (the first found on a tie), then
  its highest-scoring set holding the must-include GPUs (the first on a tie). Partitions
  are enumerated as go-gpuallocator does (each set's first GPU is the lowest GPU not yet
  placed; sets in lexicographic order), so ties resolve the same way. Choosing inside the
  best partition leaves the remaining GPUs in good sets too (less fragmentation).

Where this departs from go-gpuallocator: a padded set (fewer than ``count`` GPUs) is
never returned (go-gpuallocator can pick one when nothing must be included, and then
fails); and beyond :data:`EXACT_PARTITIONS` partitions (16 free GPUs in pairs: about
two million) the choice is the highest-scoring set, exact up to
:data:`EXACT_COMBINATIONS` candidate sets and otherwise a greedy build from every first
GPU plus single swaps. That fallback breaks ties by one NUMA node, then the closest NIC
(PIX, PXB, PHB, NODE, SYS), then the lowest indices.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gpu_topology.errors import InvalidTopology
from gpu_topology.model import PCIE_LEVELS, PCIE_ORDER, Link, LinkKind, Topology, gpu_name

NVLINK_SCORE = 100
MAX_NVLINKS = 18  # go-gpuallocator counts bonded NVLinks up to eighteen
LINK_SCORES: dict[LinkKind, int] = {
    LinkKind.BOARD: 60,
    LinkKind.PIX: 50,
    LinkKind.PXB: 40,
    LinkKind.PHB: 30,
    LinkKind.NODE: 20,
    LinkKind.SYS: 10,
}
EXACT_PARTITIONS = 20_000
EXACT_COMBINATIONS = 5_000


def link_score(link: Link | None, pcie: LinkKind | None = None) -> int:
    """The go-gpuallocator score of one GPU-GPU link: its PCIe level's score plus 100 per
    NVLink. ``pcie`` is the level beneath an NVLink when the link does not carry it."""
    if link is None:
        return 0
    if link.kind is LinkKind.NVLINK:
        beneath = link.pcie if link.pcie is not None else pcie
        nvlink = NVLINK_SCORE * min(link.nvlinks, MAX_NVLINKS)
        return nvlink + (LINK_SCORES.get(beneath, 0) if beneath is not None else 0)
    return LINK_SCORES.get(link.kind, 0)


def pcie_level(topology: Topology, a: int, b: int) -> LinkKind | None:
    """The PCIe level between GPUs ``a`` and ``b`` (None for a GPU with itself or when
    the topology holds no link between them).

    A PCIe link is its own level; an NVLink carries the level a backend measured beneath
    it. Otherwise (``nvidia-smi topo -m`` hides it) it is inferred, since PCIe levels
    nest like a tree (the two larger of three devices' pairwise levels are equal):

    1. GPUs on different NUMA nodes (or, without NUMA nodes, different CPU lists): SYS;
    2. else a third device (GPU or NIC, in topology order) whose known levels to the two
       differ: the larger of them, exactly;
    3. else the closest level some third device shares with both (an upper bound), or
       NODE for GPUs on one NUMA node, or SYS when nothing is known.
    """
    topology.gpu(a), topology.gpu(b)
    if a == b:
        return None
    link = topology.link(gpu_name(a), gpu_name(b))
    if link is None:
        return None
    known = _measured(link)
    return known if known is not None else _inferred(topology, a, b)


def pair_score(topology: Topology, a: int, b: int) -> int:
    """The score of GPUs ``a`` and ``b``; 0 for a GPU with itself."""
    topology.gpu(a), topology.gpu(b)  # unknown indices raise UnknownDevice
    if a == b:
        return 0
    return _pair_table(topology)[(a, b) if a < b else (b, a)]


def set_score(topology: Topology, gpus: Iterable[int]) -> int:
    """The sum of the pair scores of every pair in ``gpus`` (duplicates ignored)."""
    members = sorted(set(gpus))
    return sum(pair_score(topology, a, b) for a, b in itertools.combinations(members, 2))


@dataclass(frozen=True)
class GpuSet:
    """A chosen GPU set with what describes it."""

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


def partition_count(free: int, count: int) -> int:
    """How many partitions go-gpuallocator's search visits for ``free`` GPUs in sets of
    ``count`` (the padded set holds ``free mod count`` GPUs)."""
    if count <= 0 or free < count:
        return 0
    if count == 1:
        return free
    short = free % count
    whole = free - short
    sets = whole // count
    full = math.factorial(whole) // (math.factorial(count) ** sets * math.factorial(sets))
    return int(full * (math.comb(free, short) if short else 1))


def best_gpu_set(
    topology: Topology,
    free: Iterable[int],
    count: int,
    must_include: Iterable[int] = (),
) -> GpuSet | None:
    """The set of ``count`` GPUs from ``free`` holding ``must_include`` that
    go-gpuallocator's best-effort policy picks (see the module docstring).

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
    if count == 0:
        return chooser.describe(())
    if partition_count(len(free_set), count) <= EXACT_PARTITIONS:
        members = chooser.partitioned(sorted(free_set), count, frozenset(must))
    else:
        candidates = sorted(free_set - must)
        need = count - len(must)
        if math.comb(len(candidates), need) <= EXACT_COMBINATIONS:
            members = chooser.exact(sorted(must), candidates, need)
        else:
            members = chooser.local_search(sorted(must), candidates, need)
    return chooser.describe(members)


# -- pair scores ---------------------------------------------------------------------

_RANK = {kind: i for i, kind in enumerate(PCIE_LEVELS)}
_TABLES: weakref.WeakKeyDictionary[Topology, dict[tuple[int, int], int]] = weakref.WeakKeyDictionary()


def _pair_table(topology: Topology) -> dict[tuple[int, int], int]:
    """Every pair's score, computed once per topology (the search reads them often)."""
    try:
        table = _TABLES.get(topology)
    except TypeError:  # pragma: no cover - a topology that cannot be weakly referenced
        table = None
    if table is None:
        table = {}
        indices = topology.gpu_indices
        for i, a in enumerate(indices):
            for b in indices[i + 1 :]:
                link = topology.link(gpu_name(a), gpu_name(b))
                level = pcie_level(topology, a, b) if link is not None and link.is_nvlink else None
                table[(a, b)] = link_score(link, level)
        try:
            _TABLES[topology] = table
        except TypeError:  # pragma: no cover
            pass
    return table


def _measured(link: Link | None) -> LinkKind | None:
    """The PCIe level a link states: its kind, or the level measured beneath an NVLink."""
    if link is None:
        return None
    if link.kind is LinkKind.NVLINK:
        return link.pcie
    return link.kind if link.kind in _RANK else None


def _inferred(topology: Topology, a: int, b: int) -> LinkKind:
    ga, gb = topology.gpu(a), topology.gpu(b)
    if ga.locality is not None and gb.locality is not None and ga.locality != gb.locality:
        return LinkKind.SYS
    bound = LinkKind.NODE if ga.locality is not None and ga.locality == gb.locality else LinkKind.SYS
    for other in topology.device_names:
        if other in (ga.name, gb.name):
            continue
        to_a = _measured(topology.link(ga.name, other))
        to_b = _measured(topology.link(gb.name, other))
        if to_a is None or to_b is None:
            continue
        if to_a != to_b:
            return max(to_a, to_b, key=_RANK.__getitem__)
        if _RANK[to_a] < _RANK[bound]:
            bound = to_a
    return bound


# -- the search ----------------------------------------------------------------------

_Group = tuple[int | None, ...]  # one set of a partition; None pads it


class _Chooser:
    """Scores and compares candidate sets over one topology."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._pairs = _pair_table(topology)
        self._sets: dict[_Group, int] = {}
        # Per-GPU facts for the fallback's tie-breaks.
        self._place = {g.index: g.locality for g in topology.gpus}
        self._nic = {g.index: _nic_rank(topology, [g.index]) for g in topology.gpus}

    def pair(self, a: int, b: int) -> int:
        return self._pairs[(a, b) if a < b else (b, a)]

    def score(self, members: Sequence[int | None]) -> int:
        real = [m for m in members if m is not None]
        return sum(self.pair(a, b) for a, b in itertools.combinations(real, 2))

    def group_score(self, group: _Group) -> int:
        found = self._sets.get(group)
        if found is None:
            found = self._sets[group] = self.score(group)
        return found

    # go-gpuallocator's best-effort policy
    def partitioned(self, free: list[int], count: int, must: frozenset[int]) -> tuple[int, ...]:
        padding = (count - len(free) % count) % count
        devices: _Group = tuple(free) + (None,) * padding
        best: list[_Group] | None = None
        best_score = 0
        for partition in self._partitions(devices, count, padding, must, []):
            score = sum(self.group_score(g) for g in partition)
            if best is None or score > best_score:
                best, best_score = partition, score
        assert best is not None  # the caller checked that a set exists
        chosen: _Group | None = None
        chosen_score = 0
        for group in best:
            if None in group or not must <= set(group):
                continue
            score = self.group_score(group)
            if chosen is None or score > chosen_score:
                chosen, chosen_score = group, score
        assert chosen is not None
        return tuple(sorted(g for g in chosen if g is not None))

    def _partitions(
        self, devices: _Group, count: int, padding: int, must: frozenset[int], done: list[_Group]
    ) -> Iterator[list[_Group]]:
        """Every partition of ``devices`` into ``count``-sets, in go-gpuallocator's order,
        skipping those whose must-include GPUs are split or padded (it skips them too)."""
        if len(devices) == count:
            if self._acceptable(devices, must, padding):
                yield done + [devices]
            return
        first, rest = devices[0], devices[1:]
        for others in itertools.combinations(rest, count - 1):
            group = (first,) + others
            pads = sum(1 for g in group if g is None)
            if pads not in (0, padding) or not self._acceptable(group, must, padding):
                continue
            remaining = (
                tuple(d for d in rest if d not in others)
                if pads == 0
                else tuple(d for d in rest if d is not None and d not in others)
            )
            yield from self._partitions(remaining, count, padding, must, done + [group])

    @staticmethod
    def _acceptable(group: _Group, must: frozenset[int], padding: int) -> bool:
        held = must.intersection(group)
        if not held:
            return True
        return held == must and None not in group

    # the fallback: the best set directly
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

    def _greedy(self, must: list[int], candidates: list[int], need: int, seed: int | None) -> tuple[int, ...]:
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
