"""Fluid-style caching as Fluid behaves: one cache runtime per dataset, on the nodes it picked.

Who calls it: :mod:`tools.sim.engine` for the ``fluid`` policy (its scores are in
:mod:`tools.sim.baselines`). It owns the runtimes' state; the engine moves the bytes.

How Fluid works, and what is modelled (decisions of this module):

- A Fluid ``Dataset`` gets its own cache runtime (Alluxio, JuiceFS, ...): cache workers on
  a few nodes, each with a fixed quota of that node's disk. The quota is the runtime's, not
  shared: one dataset's cache never evicts another's. Here a runtime is created on the
  dataset's first read with ``ceil(size / cache_bytes_per_node)`` workers (the fewest that
  hold it), each with a quota of ``size / workers``: on the reading pod's node first when
  its uncommitted disk has room, then on the nodes with the most uncommitted room. When no
  node has room the dataset gets no runtime and every read goes to storage (the quotas of
  the runtimes already there stay committed; nothing in Fluid takes them back).
- The nodes with workers are labelled; pods prefer them (label affinity, name only).
- Pods read through FUSE while they train (no wait before the first step):
  a pod on the single worker's node of a ready copy reads locally (**a hit**); a pod
  anywhere else reads from the workers over the network (no storage bytes, not a hit);
  a version the runtime does not hold yet (first read, or a new version: new files) is read
  from storage once by the first pod, filling the runtime (it replaces the old version in
  the same quota); pods that come while it fills read through it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Runtime:
    workers: tuple[int, ...]  # node indices; empty: no room was found, no cache
    quota: int  # bytes per worker
    ready: int | None = None  # the version the runtime holds
    filling: int | None = None  # the version being read in


@dataclass
class FluidRuntimes:
    cache_bytes: int  # disk per node
    runtimes: dict[str, Runtime] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)  # node index -> quota bytes committed

    def read(
        self, key: tuple[str, int], size: int, node: int, room: Callable[[], list[tuple[int, int]]]
    ) -> tuple[tuple[int, ...], str]:
        """A pod on ``node`` reads version ``key``. Returns (nodes given new workers, how it
        reads): ``local``, ``remote`` (from the workers), ``fill`` (from storage, filling
        the runtime) or ``storage`` (no runtime)."""
        name, version = key
        created: tuple[int, ...] = ()
        rt = self.runtimes.get(name)
        if rt is None:
            rt = self.runtimes[name] = self._create(size, node, room())
            created = rt.workers
        if not rt.workers:
            return created, "storage"
        if rt.ready == version:
            return created, "local" if rt.workers == (node,) else "remote"
        if rt.filling == version:
            return created, "remote"
        rt.filling = version
        return created, "fill"

    def filled(self, key: tuple[str, int]) -> None:
        rt = self.runtimes.get(key[0])
        if rt is not None and rt.filling == key[1]:
            rt.ready, rt.filling = key[1], None

    def _create(self, size: int, node: int, room: list[tuple[int, int]]) -> Runtime:
        count = max(1, math.ceil(size / self.cache_bytes))
        quota = math.ceil(size / count)
        fits = [i for i, free in room if free >= quota]
        order = sorted(fits, key=lambda i: (i != node, -dict(room)[i], i))
        if len(order) < count:
            return Runtime((), quota)
        workers = tuple(order[:count])
        for w in workers:
            self.committed[w] = self.committed.get(w, 0) + quota
        return Runtime(workers, quota)


__all__ = ["FluidRuntimes", "Runtime"]
