"""Fluid as it is deployed: a Dataset and its cache runtime of ``replicas`` workers x ``quota``.

Who calls it: :mod:`tools.sim.reads` for the ``fluid*`` policies (the webhook's affinity
is in :mod:`tools.sim.baselines`). It owns the runtimes' state: their workers, each
worker's blocks of the version it caches, and which runtimes are being read; the engine
moves the bytes. Every choice below is cited in ``docs/simulator.md`` (section Fluid).

- A Dataset gets its own runtime (AlluxioRuntime or JuiceFSRuntime) with the user's
  ``replicas`` and tiered-store ``quota`` per worker; the policy names the replicas:
  ``fluid-r1``, ``fluid-r4``, ``fluid`` (enough workers to hold the dataset,
  ``ceil(size / node cache)``), ``fluid-excl`` (as ``fluid``, ``placement: Exclusive``),
  ``fluid-r4+pack`` (as ``fluid-r4``, under a kube-scheduler that packs GPU pods as ours
  does: :data:`PACKED`, scored in :mod:`tools.sim.baselines`), ``fluid-r4+passive`` (as
  ``fluid-r4``, with Alluxio's passive caching on: :data:`PASSIVE`), ``fluid-job`` (a
  worker on every node of the job that first reads it, passive caching on:
  :data:`ON_JOB_NODES`).
  The quota is the workload's ``fluid_quota_bytes``, else the dataset's size over the
  replicas (what a user sizing the runtime for the dataset writes), at most the node's cache.
- Workers go on the first reader's node when it has room, then on the nodes with the most
  uncommitted cache. ``Shared`` placement (Fluid's default) lets workers of several
  runtimes share a node up to its cache; ``Exclusive`` gives a node one runtime's worker.
- When no nodes have room, idle runtimes (no pod reading them) are scaled in, least
  recently used first, as a platform team does to make room: their blocks are dropped
  and their nodes' labels removed (:attr:`FluidRuntimes.scale_ins`).
- Blocks: Alluxio 2.x's default ``LocalFirstPolicy``: a block read from the store is
  cached on the reading client's local worker while it has room, else on another worker
  (by free room). A pod reads its share of an epoch: the blocks on its own node's worker
  locally, the other cached blocks from their workers over the network, the rest from the
  store (filling the cache while the runtime has room). Reads are shuffled every epoch,
  so the cached share of a read is the cached share of the dataset.
- A new version (new files) is new blocks: the old ones stop counting and the new ones
  fill the same quota.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

POLICIES = ("fluid", "fluid-r1", "fluid-r4", "fluid-excl", "fluid-r4+pack", "fluid-r4+passive", "fluid-job")
REPLICAS: dict[str, int | None] = {
    "fluid": None,
    "fluid-r1": 1,
    "fluid-r4": 4,
    "fluid-excl": None,
    "fluid-r4+pack": 4,
    "fluid-r4+passive": 4,
    "fluid-job": None,
}
#: Alluxio's passive caching on (``alluxio.user.file.passive.cache.enabled``, true in
#: Alluxio's own defaults; Fluid's AlluxioRuntime turns it off): a block a client reads from
#: another worker is also cached on its own node's worker
PASSIVE = ("fluid-r4+passive", "fluid-job")
#: a worker on every node of the job that first reads the dataset (the runtime's replicas
#: and node affinity set to the job's nodes), as many more as hold the dataset; with
#: passive caching on, so that each of those workers keeps what its node's pods read
ON_JOB_NODES = ("fluid-job",)
#: the Fluid settings placed by a kube-scheduler configured as the chart configures ours
#: (``NodeResourcesFit`` MostAllocated) instead of the default spreading
PACKED = ("fluid-r4+pack",)


@dataclass
class Runtime:
    name: str
    workers: tuple[int, ...]  # node indices; empty: no room was found, no cache
    quota: int  # bytes per worker
    version: int = -1  # the version whose blocks ``held`` counts
    held: dict[int, float] = field(default_factory=dict)  # worker node -> cached bytes of ``version``
    # worker node -> bytes of ``version`` it cached passively (copies of other workers' blocks)
    copies: dict[int, float] = field(default_factory=dict)
    readers: int = 0  # pods reading through it now
    last_used: float = 0.0

    @property
    def cached(self) -> float:
        return sum(self.held.values())


@dataclass(frozen=True)
class Split:
    """One pod's reads: bytes from its own node's worker, other workers, the store."""

    local: float
    remote: float
    store: float

    def __add__(self, other: Split) -> Split:
        return Split(self.local + other.local, self.remote + other.remote, self.store + other.store)


@dataclass
class FluidRuntimes:
    cache_bytes: int  # disk per node
    replicas: int | None = None  # None: enough to hold the dataset
    quota_bytes: int = 0  # 0: size / replicas, at most cache_bytes
    exclusive: bool = False
    passive: bool = False  # PASSIVE
    on_job_nodes: bool = False  # ON_JOB_NODES
    runtimes: dict[str, Runtime] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)  # node index -> quota bytes committed
    hosts: dict[int, int] = field(default_factory=dict)  # node index -> runtimes with a worker there
    scale_ins: int = 0
    dropped_bytes: float = 0.0  # cached bytes lost to scale-in

    @classmethod
    def for_policy(cls, policy: str, cache_bytes: int, quota_bytes: int) -> FluidRuntimes:
        return cls(
            cache_bytes, REPLICAS[policy], quota_bytes, exclusive=policy == "fluid-excl", passive=policy in PASSIVE,
            on_job_nodes=policy in ON_JOB_NODES,
        )  # fmt: skip

    def runtime(
        self,
        name: str,
        size: int,
        node: int,
        room: Callable[[], list[tuple[int, int]]],
        now: float,
        job_nodes: Sequence[int] = (),
    ) -> tuple[Runtime, tuple[int, ...], tuple[int, ...]]:
        """The dataset's runtime, created on first use: (runtime, nodes given workers, nodes
        whose workers were scaled in to make room). With :data:`ON_JOB_NODES`, a worker on
        each of ``job_nodes`` (the nodes of the job that creates it) first."""
        rt = self.runtimes.get(name)
        if rt is not None and rt.workers:
            rt.last_used = now
            return rt, (), ()
        count = self.replicas or max(1, math.ceil(size / self.cache_bytes))
        wanted = tuple(dict.fromkeys(job_nodes)) if self.on_job_nodes else ()
        count = max(count, len(wanted))
        # with passive caching a worker keeps copies of other workers' blocks too: sized to
        # hold the whole dataset, as a user turning it on for locality sizes the quota
        share = size if self.passive else math.ceil(size / count)
        quota = self.quota_bytes or min(self.cache_bytes, share)
        dropped: list[int] = []
        workers = self._place(count, quota, node, room(), wanted)
        while workers is None:
            idle = [r for r in self.runtimes.values() if r.workers and r.readers == 0 and r.name != name]
            if not idle:
                break
            victim = min(idle, key=lambda r: (r.last_used, r.name))
            dropped += self._scale_in(victim)
            workers = self._place(count, quota, node, room(), wanted)
        rt = self.runtimes[name] = Runtime(name, workers or (), quota, last_used=now)
        for w in rt.workers:
            self.committed[w] = self.committed.get(w, 0) + quota
            self.hosts[w] = self.hosts.get(w, 0) + 1
        return rt, rt.workers, tuple(dropped)

    def _place(
        self, count: int, quota: int, node: int, room: list[tuple[int, int]], wanted: Sequence[int] = ()
    ) -> tuple[int, ...] | None:
        fits = [(i, free) for i, free in room if free >= quota and not (self.exclusive and self.hosts.get(i, 0))]
        order = sorted(fits, key=lambda item: (item[0] not in wanted, item[0] != node, -item[1], item[0]))
        return tuple(i for i, _ in order[:count]) if len(order) >= count else None

    def _scale_in(self, rt: Runtime) -> list[int]:
        self.scale_ins += 1
        self.dropped_bytes += rt.cached
        for w in rt.workers:
            self.committed[w] -= rt.quota
            self.hosts[w] -= 1
        gone = list(rt.workers)
        del self.runtimes[rt.name]
        return gone

    def split(self, rt: Runtime, version: int, size: float, node: int, amount: float) -> Split:
        """How ``amount`` bytes a pod on ``node`` reads split over its own node's worker,
        the other workers and the store, as the runtime holds the version now."""
        if rt.version != version:  # new files: new blocks
            rt.version, rt.held, rt.copies = version, {w: 0.0 for w in rt.workers}, {}
        if not rt.workers or size <= 0:
            return Split(0.0, 0.0, amount)
        return self._split(rt, size, node, amount)

    def fill(self, rt: Runtime, node: int, amount: float) -> None:
        """Blocks a pod on ``node`` read from the store, cached local-first
        (``LocalFirstPolicy``): its own node's worker while it has room, then the other
        workers by free room, while the runtime has room."""
        amount = min(amount, rt.quota * len(rt.workers) - rt.cached)
        if amount <= 0:
            return
        if node in rt.held:
            put = min(amount, rt.quota - rt.held[node])
            rt.held[node] += put
            amount -= put
        others = {w: rt.quota - h for w, h in rt.held.items() if w != node and rt.quota - h > 0}
        room = sum(others.values())
        for w, free in others.items():
            rt.held[w] += min(free, amount * free / room)

    def passive_fill(self, rt: Runtime, node: int, remote: float) -> None:
        """With :data:`PASSIVE`: blocks a pod on ``node`` read from other workers, also cached
        on its own node's worker while that worker's quota has room (duplicates: the
        runtime's unique cached bytes do not grow)."""
        if not self.passive or node not in rt.held or remote <= 0:
            return
        room = rt.quota - rt.held[node] - rt.copies.get(node, 0.0)
        if room > 0:
            rt.copies[node] = rt.copies.get(node, 0.0) + min(room, remote)

    @staticmethod
    def _split(rt: Runtime, size: float, node: int, amount: float) -> Split:
        cached = min(1.0, rt.cached / size)
        local = min(cached, (rt.held.get(node, 0.0) + rt.copies.get(node, 0.0)) / size)
        return Split(amount * local, amount * (cached - local), amount * (1.0 - cached))


__all__ = ["ON_JOB_NODES", "PACKED", "PASSIVE", "POLICIES", "REPLICAS", "FluidRuntimes", "Runtime", "Split"]
