"""Which cached datasets to evict: pure functions of their inputs (docs/design.md#eviction).

Who calls it: :mod:`dsagent.cache.service` (before every fetch, in the idle sweep and for
``POST /v1/evict``), which gathers the candidates and the free space and applies the
result. Nothing here touches the disk or reads the clock; ``now`` is passed in.

The rule: to cache a dataset of ``size`` bytes, free space must reach ``ratio x size``
(1.2 by default), counting the space other fetches in flight have reserved. When it does
not, evict datasets that are neither in use nor being fetched, least recently used first,
and stop as soon as free space reaches the target. When even evicting every candidate
would not reach it, evict nothing and report the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One cached dataset version as the policy sees it."""

    name: str
    digest: str
    size_bytes: int
    last_used: float  # seconds since the epoch
    in_use: bool = False
    fetching: bool = False

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


def plan_for_fetch(candidates: Iterable[Candidate], *, size: int, free: int, ratio: float = 1.2) -> Plan:
    """Victims that make room for a dataset of ``size`` bytes, given ``free`` bytes now.

    ``free`` must already subtract the reservations of other fetches in flight. Returns
    no victims when space suffices, and no victims (``sufficient`` false) when it cannot.
    """
    target = needed_bytes(size, ratio)
    order = lru_order(candidates)
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
    """Evictable datasets unused for longer than ``idle_ttl`` seconds (0 disables), LRU first."""
    if idle_ttl <= 0:
        return ()
    return tuple(c for c in lru_order(candidates) if now - c.last_used > idle_ttl)


def unused_victims(candidates: Iterable[Candidate]) -> tuple[Candidate, ...]:
    """Every evictable dataset, LRU first (``dsctl evict --all-unused``)."""
    return tuple(lru_order(candidates))


__all__ = ["Candidate", "Plan", "idle_victims", "lru_order", "needed_bytes", "plan_for_fetch", "unused_victims"]
