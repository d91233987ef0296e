"""A JuiceFS cache group: 4 MiB blocks on a consistent-hash ring over a group of nodes.

Who calls it: :mod:`tools.sim.reads` for the ``juicefs`` policy. It owns the group's
cached bytes per dataset version and their eviction; the engine moves the bytes. Choices
(cited in ``docs/simulator.md``, section JuiceFS):

- Every node's JuiceFS client mounts with the same ``--cache-group``, its ``--cache-dir``
  on the node's NVMe with ``--cache-size`` the node's cache (``juicefs_group_nodes``
  limits the group to the first N nodes; the others mount with ``--no-sharing``: they read
  the group's cache and hold none).
- A file is split into 4 MiB blocks (JuiceFS's default block size); each block's cache
  node is chosen by consistent hashing over the group's members, so a member holds
  ``1/N`` of any dataset's cached blocks and a reader finds ``1/N`` of them on its own disk.
- A block missing from the group is read from the store once, by its owner, and kept: the
  group fills each block once (``each miss filled once``), whoever reads it.
- When the group's disks are full, the least recently read dataset versions' blocks go
  (JuiceFS evicts per node; blocks are spread evenly, so per node and group-wide agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.sim.fluid import Split

BLOCK_BYTES = 4 * 2**20


@dataclass
class CacheGroup:
    members: frozenset[int]
    capacity: float  # bytes over every member's cache
    cached: dict[tuple[str, int], float] = field(default_factory=dict)
    last_read: dict[tuple[str, int], float] = field(default_factory=dict)
    evicted_bytes: float = 0.0

    @property
    def used(self) -> float:
        return sum(self.cached.values())

    def serving(self, node: int) -> tuple[int, ...]:
        """The members a pod on ``node`` reads remote blocks from: every member but itself."""
        return tuple(sorted(self.members - {node}))

    def split(self, key: tuple[str, int], size: float, node: int, amount: float) -> Split:
        """How ``amount`` bytes a pod on ``node`` reads split over its own disk, the other
        members and the store, as the group holds the version now."""
        if size <= 0:
            return Split(0.0, 0.0, amount)
        cached = min(1.0, self.cached.get(key, 0.0) / size)
        local = cached / len(self.members) if node in self.members else 0.0
        return Split(amount * local, amount * (cached - local), amount * (1.0 - cached))

    def fill(self, key: tuple[str, int], size: float, amount: float, now: float) -> None:
        """Blocks read from the store, each kept once by its owner; the least recently read
        versions' blocks go when the group is full."""
        self.last_read[key] = now
        amount = min(amount, max(0.0, size - self.cached.get(key, 0.0)))
        if amount <= 0:
            return
        self._evict_for(key, amount)
        self.cached[key] = self.cached.get(key, 0.0) + min(amount, self.capacity - self.used)

    def _evict_for(self, key: tuple[str, int], need: float) -> None:
        while self.capacity - self.used < need:
            others = [k for k in self.cached if k != key]
            if not others:
                return
            victim = min(others, key=lambda k: (self.last_read.get(k, 0.0), k))
            self.evicted_bytes += self.cached.pop(victim)


__all__ = ["BLOCK_BYTES", "CacheGroup"]
