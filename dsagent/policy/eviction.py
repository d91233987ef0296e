"""Which cached datasets to evict: pure functions of their inputs (docs/design.md#eviction).

Who calls it: :mod:`dsagent.cache.service` (before every fetch, in the idle sweep and for
``POST /v1/evict``), which gathers the candidates and the free space and applies the
result. Nothing here touches the disk or reads the clock; ``now`` is passed in.

The rule: to cache a dataset of ``size`` bytes, free space must reach ``ratio x size``
(:data:`EVICT_RATIO`, 1.2, by default), counting the space other fetches in flight have reserved. When it does
not, evict datasets that are neither in use nor being fetched and stop as soon as free
space reaches the target. When even evicting every candidate would not reach it, evict
nothing and report the numbers.

The order (docs/design.md#cluster-eviction, docs/design-striping.md#eviction): copies
whose version other nodes also hold ready go first, most other copies first
(``Candidate.copies``, from the cluster's inventories; for this node's shares of striped
versions, ``Candidate.striped``, the count as for a whole copy here); then the cluster's
only copies of their bytes, last copies and shares alike, the least recently used first.
So the cluster's last copy of a version (no other holder), or of a share's bundles, is
evicted only when the replicated ones cannot free enough. Shares are evicted only to make
room: they have leases of their own (the holder renews them), so the idle sweep and
``--all-unused`` leave them. A count that is not known
(``copies`` None: a standalone agent, or no fresh count from the cluster) ranks as no
other copy, the safe side; with no counts at all the order is plain LRU, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: the eviction rule's ratio: free space must reach this many times the size being cached.
#: The agent's default (``DSAGENT_EVICT_RATIO``) and the controller's room check for replicas
EVICT_RATIO = 1.2


@dataclass(frozen=True)
class Candidate:
    """One cached dataset version as the policy sees it."""

    name: str
    digest: str
    size_bytes: int
    last_used: float  # seconds since the epoch
    in_use: bool = False
    fetching: bool = False
    copies: int | None = None  # other nodes holding this very version ready; None: unknown
    striped: bool = False  # this node's share of a striped version (docs/design-striping.md)
    kept: bool = False  # a whole share no group holds any more (released ``keep=whole``): a copy like any

    @property
    def other_copies(self) -> int:
        """The count the order uses: unknown or nonsense counts as no other copy (keep it)."""
        return self.copies if self.copies is not None and self.copies > 0 else 0

    @property
    def evictable(self) -> bool:
        return not (self.in_use or self.fetching)


@dataclass(frozen=True)
class Plan:
    """The policy's answer: victims in eviction order and the numbers behind it."""

    victims: tuple[Candidate, ...]
    needed_bytes: int  # ratio x size: free space the fetch wants
    free_bytes: int  # free space now, after other fetches' reservations
    evictable_bytes: int  # what evicting every candidate could free

    @property
    def sufficient(self) -> bool:
        return self.free_bytes + self.freed_bytes >= self.needed_bytes

    @property
    def freed_bytes(self) -> int:
        return sum(v.size_bytes for v in self.victims)


def needed_bytes(size: int, ratio: float) -> int:
    """The eviction rule's target: ``ratio`` times the dataset's size, rounded up."""
    return math.ceil(size * ratio)


def lru_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Evictable candidates, least recently used first (ties: larger first, then by name)."""
    usable = [c for c in candidates if c.evictable]
    return sorted(usable, key=lambda c: (c.last_used, -c.size_bytes, c.name, c.digest))


#: eviction classes, evicted first to last: copies whose bytes other nodes also hold, then
#: the cluster's only copies of their bytes
REPLICATED, LAST_COPY = 0, 1


def eviction_class(candidate: Candidate) -> int:
    """Whether other nodes hold the candidate's bytes ready: :data:`REPLICATED` where they
    hold its version (whole copies, and the shares of a version held whole elsewhere, whose
    group fills again from those copies), else :data:`LAST_COPY` (an unknown count is the
    safe side). A stripe share of a version no node holds whole is the only copy of its
    bundles, as a last copy is of its version: evicting either has the store serve those
    bytes again when they are next read (a share's readers, every epoch until its slot is
    owned again), so one class holds both, the least recently used first."""
    return REPLICATED if candidate.other_copies else LAST_COPY


def eviction_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Evictable candidates in the order a fetch evicts them (docs/design.md#cluster-eviction):
    by :func:`eviction_class`; among replicated copies, most other ready copies in the
    cluster first; then least recently used (ties as :func:`lru_order`). Without counts
    and shares this is :func:`lru_order`."""
    return sorted(lru_order(candidates), key=lambda c: (eviction_class(c), -c.other_copies))  # stable: LRU


def plan_for_fetch(candidates: Iterable[Candidate], *, size: int, free: int, ratio: float = EVICT_RATIO) -> Plan:
    """Victims that make room for a dataset of ``size`` bytes, given ``free`` bytes now.

    ``free`` must already subtract the reservations of other fetches in flight. Returns
    no victims when space suffices, and no victims (``sufficient`` false) when it cannot.
    Victims come in :func:`eviction_order`, so a last copy in the cluster is among them
    only when the versions other nodes also hold cannot reach the target on their own.
    """
    target = needed_bytes(size, ratio)
    order = eviction_order(candidates)
    evictable = sum(c.size_bytes for c in order)
    if free >= target or free + evictable < target:  # nothing to evict, or no use evicting
        return Plan((), target, free, evictable)
    victims: list[Candidate] = []
    reached = free
    for candidate in order:
        if reached >= target:
            break
        victims.append(candidate)
        reached += candidate.size_bytes
    return Plan(tuple(victims), target, free, evictable)


def idle_victims(candidates: Iterable[Candidate], *, now: float, idle_ttl: float) -> tuple[Candidate, ...]:
    """Evictable datasets unused for longer than ``idle_ttl`` seconds (0 disables), LRU first:
    a whole copy kept with no lease too, not a share a group holds (its lease decides)."""
    if idle_ttl <= 0:
        return ()
    return tuple(c for c in lru_order(candidates) if now - c.last_used > idle_ttl and (c.kept or not c.striped))


def unused_victims(candidates: Iterable[Candidate]) -> tuple[Candidate, ...]:
    """Every evictable dataset, LRU first (``dsctl evict --all-unused``): a whole copy kept
    with no lease too, not a share a group holds."""
    return tuple(c for c in lru_order(candidates) if c.kept or not c.striped)


__all__ = [
    "LAST_COPY",
    "REPLICATED",
    "Candidate",
    "eviction_class",
    "Plan",
    "eviction_order",
    "idle_victims",
    "lru_order",
    "needed_bytes",
    "plan_for_fetch",
    "unused_victims",
]
