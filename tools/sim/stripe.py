"""``ours+stripe``: a version bigger than one node's cache, striped by bundle over a group.

Who calls it: :mod:`tools.sim.reads` for ``ours+stripe`` and ``ours+stripe+early``. It
owns the groups (members, the bytes each owns, which members hold their share) and the
owner rule; the engine moves the bytes and makes room with the agent's eviction policy.

- A version whose 1.2x size exceeds a node's cache is split into bundles (about 800 MB,
  the agent's packing); each bundle has one owner among the group's members, chosen by
  rendezvous hashing (highest random weight) over the members, so every agent computes
  the same owner and no per-bundle directory exists; adding or losing a member moves only
  that member's bundles.
- The group: the job's own nodes first, then nodes already holding bundles of the
  version, then nodes with room in the job's RoCE subnet (the same class layout), until
  every member's share fits its cache with the agent's 1.2x headroom.
- Reading is rank-affine: each rank reads the bundles its node owns from local disk;
  bundles owned by members outside the job are read from them (peers), the store only
  for a member that lost its share (a hole costs only its own bundles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BUNDLE_BYTES = 800 * 10**6
HEADROOM = 1.2  # the agent's free-space ratio for a fetch
_MASK = (1 << 64) - 1


@dataclass
class Group:
    key: tuple[str, int]
    members: tuple[int, ...]
    owned: dict[int, float]  # member -> bytes it owns
    holding: set[int] = field(default_factory=set)  # members whose share is on disk (or being fetched)
    fill: dict[int, float] = field(default_factory=dict)  # member -> part of its share on its disk (0..1)
    users: int = 0  # pods reading the version now
    readers: dict[int, int] = field(default_factory=dict)  # job id -> its pods reading through the group
    jobs: set[tuple[int, float]] = field(default_factory=set)  # (job id, start) the group was repaired for


def needs_group(size: float, cache_bytes: int) -> bool:
    return size * HEADROOM > cache_bytes


def _mix(x: int) -> int:
    """splitmix64's finaliser: a fast, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def bundles(size: float) -> int:
    """How many bundles a version of ``size`` bytes packs into."""
    return max(1, math.ceil(size / BUNDLE_BYTES))


def owners(key: tuple[str, int], size: float, members: tuple[int, ...]) -> dict[int, float]:
    """Bytes each member owns under rendezvous hashing of the version's bundles."""
    count = bundles(size)
    seed = _mix(sum(ord(c) * 131**i for i, c in enumerate(key[0])) ^ (key[1] << 32))
    salts = [(_mix(seed ^ (m + 1) * 0x632BE59BD9B4E019), m) for m in members]
    counts = dict.fromkeys(members, 0)
    for b in range(count):
        hb = _mix(seed + b)
        best = max(salts, key=lambda s: _mix(hb ^ s[0]))
        counts[best[1]] += 1
    last = size - (count - 1) * BUNDLE_BYTES  # the last bundle is short
    per = {m: float(c * BUNDLE_BYTES) for m, c in counts.items()}
    if count:
        top = max(members, key=lambda m: counts[m])
        per[top] -= BUNDLE_BYTES - last
    return per


def members_needed(size: float, cache_bytes: int) -> int:
    return max(1, math.ceil(size * HEADROOM / cache_bytes)) if cache_bytes > 0 else 0


__all__ = ["BUNDLE_BYTES", "HEADROOM", "Group", "bundles", "members_needed", "needs_group", "owners"]
