"""``ours+stripe``: a version the cluster's caches hold together, striped by bundle over a group.

Who calls it: :mod:`tools.sim.reads` and :mod:`tools.sim.stripereads` for ``ours+stripe``
and ``ours+stripe+early``, which ask the product when a group is used and how many members
it has (:mod:`dsagent.policy.holding`) and choose who they are (the model:
``docs/simulator.md``, section ``ours+stripe``). This module owns the group's record (its slots' nodes, the bytes
each owns, which hold their share and how much of it is on disk) and the owner rule:

- A version is split into bundles (about 800 MB, the agent's packing); each bundle has one
  owner among the group's slots, chosen by rendezvous hashing (highest random weight), so
  every agent computes the same owner and no per-bundle directory exists; adding a slot
  moves only the bundles it takes. Which node holds a slot is recorded with the group, so
  a member that leaves hands its slot, and only its slot's bundles, to another node.
- A member makes room for its whole share when it joins; its bundles arrive as readers
  read them (``Group.fill``), each read from the store once, through its owner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BUNDLE_BYTES = 800 * 10**6
_MASK = (1 << 64) - 1


@dataclass
class Group:
    key: tuple[str, int]
    members: tuple[int, ...]  # the node holding each slot, in slot order; < 0: no node (a hole)
    owned: dict[int, float]  # member -> bytes its slot owns
    # members that joined without a share (no room): they read through their window and
    # hold no slot, so a later re-plan does not hand them bundles the owners hold
    shareless: set[int] = field(default_factory=set)
    holding: set[int] = field(default_factory=set)  # members whose share is on disk (or being fetched)
    fill: dict[int, float] = field(default_factory=dict)  # member -> part of its share on its disk (0..1)
    # member -> part of its share that joined with it from the old owners' disks: read from
    # them in its first job's first epoch, on its own disk after that
    arriving: dict[int, float] = field(default_factory=dict)
    users: int = 0  # pods reading the version now
    last_read: float = 0.0  # when its last reader ended (users fell to 0)
    readers: dict[int, int] = field(default_factory=dict)  # job id -> its pods reading through the group
    jobs: set[tuple[int, float]] = field(default_factory=set)  # (job id, start) the group was repaired for
    # (job id, member) -> the part of the member's share on its disk when the job's first
    # rank asked: the job's ranks read disjoint parts of a member's bundles, so each rank's
    # misses are counted against what was there before the job, not what another rank filled
    seen: dict[tuple[int, int], float] = field(default_factory=dict)


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


__all__ = ["BUNDLE_BYTES", "Group", "bundles", "owners"]
