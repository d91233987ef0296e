"""The simulator's hooks into the cluster-side cache policies (preparation, replication), kept out of
:mod:`tools.sim.engine` so that the engine only calls them.

Who calls it: the simulation. :class:`tools.sim.state.SimState` holds one of each hook,
:mod:`tools.sim.reads` asks the copy counts at its eviction call site and, opt-in, the event
loop of :class:`tools.sim.engine.Simulation` runs preparation and replication. It owns no
policy: the decisions are the product's (:mod:`dsagent.policy.eviction` with the copy
counts of :mod:`dsagent.policy.copies`, :mod:`dsagent.policy.preparation`); this module
turns the simulated cluster into their inputs, as the Dataset controller does from Nodes
and pods, at the controller's resync.

Decision: the hooks sit below the state and the engine. They are handed the simulation
each time they are called and read it through :class:`Cluster`, the part of it they use,
so that they import neither the state nor the engine.
"""

from __future__ import annotations

import math
from typing import Protocol

from dsagent.policy import copies, preparation, replication
from tools.sim.cluster import CacheEntry, ClusterParams, Fetch, Node, Outcome
from tools.sim.workload import Dataset, Job

RESYNC_S = 30.0  # the Dataset controller's resync: how old counts may be, how often it plans


class Cluster(Protocol):
    """What the hooks read of a simulation and ask of it (:class:`tools.sim.state.SimState`
    is one): the clock, the nodes and their caches, the jobs waiting and running, the open
    transfers, and the agent's actions a controller task sets off on a node."""

    now: float
    params: ClusterParams
    nodes: list[Node]
    datasets: dict[str, Dataset]
    waiting: list[Job]
    running: dict[int, Outcome]
    fetches: list[Fetch]
    ready_copies: dict[tuple[str, int], set[int]]
    started_log: list[tuple[float, str, int]]
    task_fetch_bytes: dict[str, int]

    def push(self, t: float, kind: str, ident: int) -> None: ...

    def touch(self, node: Node) -> None: ...

    def _make_room(self, node: Node, size: int) -> bool: ...

    def _fetch_version(
        self, node: Node, key: tuple[str, int], size: int, *, cached: bool, waiter: tuple[Job, int] | None
    ) -> None: ...


class CopyCounts:
    """Ready copies per version as the controller publishes them
    (docs/design.md#cluster-eviction): counted over every node's cache, at most
    ``RESYNC_S`` old, as the agents see them between resyncs."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        self.keepers: dict[tuple[str, int], str] = {}
        self.made_at: float | None = None

    def get(self, sim: Cluster) -> dict[tuple[str, int], int]:
        if self.made_at is None or sim.now - self.made_at >= RESYNC_S:
            holders: dict[tuple[str, int], list[str]] = {}
            for n in sim.nodes:
                for key, e in n.cache.items():
                    if e.ready and not e.stripe:  # a stripe share is the group's only copy of its bundles
                        holders.setdefault(key, []).append(n.name)
            self.counts = {key: len(names) for key, names in holders.items()}
            self.keepers = {  # the controller's keepers
                key: copies.keeper(f"{key[0]}@{key[1]}", names) for key, names in holders.items() if len(names) > 1
            }
            self.made_at = sim.now
        return self.counts

    def others(self, sim: Cluster, key: tuple[str, int], ready_here: bool, node: str | None = None) -> int:
        """The agent's rule (:meth:`dsagent.policy.copies.ClusterCopies.others`): the count less
        itself, and none to the version's keeper (``node`` asking, holding it ready)."""
        counts = self.get(sim)
        if ready_here and node is not None and self.keepers.get(key) == node:
            return 0
        return max(0, counts.get(key, 0) - (1 if ready_here else 0))


class NextJobPreparation:
    """Next-job preparation (docs/design.md#next-job-preparation), opt-in: every
    ``RESYNC_S`` while a job waits, the product's policy predicts where the waiting jobs
    start; phase 2 fetches their data into that node's cache, protected until the plan drops
    it, when it is an eviction candidate at once. Phase 1 is the controller's ledger only."""

    def __init__(self, thresholds: preparation.Thresholds | None = None) -> None:
        self.thresholds = thresholds or preparation.Thresholds()
        self.planned_at = -math.inf
        self.started: set[tuple[str, str]] = set()  # (pod, node) pairs in phase 2

    def __call__(self, sim: Cluster) -> None:
        if sim.now - self.planned_at < RESYNC_S:
            return
        self.planned_at = sim.now
        if sim.waiting and sim.running:  # wake up again while a queued job waits for GPUs
            sim.push(sim.now + RESYNC_S, "prepare", -1)
        plan = preparation.plan(
            self.nodes(sim), self.waiting(sim), now=sim.now, thresholds=self.thresholds, fetching=self.started
        )
        by_name = {n.name: n for n in sim.nodes}
        keep: set[tuple[int, tuple[str, int]]] = set()
        self.started = set()
        for prep in plan:
            if prep.phase != 2:
                continue
            node = by_name[prep.node]
            for want in prep.datasets:
                key = (want.name, int(want.digest, 16))
                if key not in node.cache:
                    if not sim._make_room(node, want.size_bytes):
                        continue
                    node.cache[key] = CacheEntry(want.name, key[1], want.size_bytes, sim.now, by_task="prepare")
                    sim._fetch_version(node, key, want.size_bytes, cached=True, waiter=None)
                    sim.task_fetch_bytes["prepare"] = sim.task_fetch_bytes.get("prepare", 0) + want.size_bytes
                    sim.touch(node)
                node.cache[key].prepared = True
                keep.add((node.index, key))
            self.started.add((prep.job, prep.node))
        for node in sim.nodes:  # cleanup: what is no longer planned may be evicted at once
            for key, e in node.cache.items():
                if e.prepared and (node.index, key) not in keep:
                    e.prepared = False

    @staticmethod
    def nodes(sim: Cluster) -> list[preparation.NodeState]:
        ends: dict[int, list[preparation.Running]] = {}
        for out in sim.running.values():
            for w in out.workers:
                ends.setdefault(w.node.index, []).append(preparation.Running(len(w.gpus), out.end))
        # a job bound there still fetching what its first step waits for (its training
        # reads, open while it runs, are not a wait for its own data)
        waiting_for_data = {f.node.index for f in sim.fetches if f.waiters and not f.stream}

        def state(n: Node) -> preparation.NodeState:
            return preparation.NodeState(
                n.name,
                sim.params.cache_bytes,
                sum(e.on_disk for e in n.cache.values() if e.users > 0),
                len(n.free),
                tuple(ends.get(n.index, ())),
                frozenset((name, f"{v:032x}") for name, v in n.cache),
                data_wait=n.index in waiting_for_data,
            )

        return [state(n) for n in sim.nodes if n.free or n.index in ends]

    @staticmethod
    def waiting(sim: Cluster) -> list[preparation.Waiting]:
        out = []
        for job in sim.waiting[: sim.params.queue_scan]:
            d = sim.datasets[job.dataset]
            want = preparation.Want(d.name, f"{d.version_at(sim.now):032x}", d.size)
            out += [
                preparation.Waiting(f"{job.id}/{i}", job.gpus_per_worker, (want,), group=str(job.id))
                for i in range(job.workers)
            ]
        return out


class Replication:
    """Replication of hot data (docs/design.md#replication), every Dataset with
    ``spec.replicas: auto``: every ``RESYNC_S`` the controller's pass
    (:func:`dsagent.controller.warmup.replicas_status`) over the datasets with demand or copies held: the
    demand as :func:`dsagent.controller.podfacts.demand` counts it (pods waiting for GPUs plus
    pods started within ``window_s``), the product's :func:`replication.target` and
    :func:`replication.choose` over every node's room, then a ``replica`` task on each chosen
    node (the version fetched as the agent fetches, P2P first, and held: in use, never
    evicted) and released on the nodes no longer chosen."""

    def __init__(self, *, window_s: float = 3600.0, max_auto: int = 16) -> None:
        self.window_s, self.max_auto = window_s, max_auto  # the controller's defaults
        self.planned_at = -math.inf
        self.held: dict[str, tuple[tuple[str, int], list[str]]] = {}  # dataset -> (version, chosen nodes)

    def __call__(self, sim: Cluster) -> None:
        if sim.now - self.planned_at < RESYNC_S:
            return
        self.planned_at = sim.now
        demand: dict[str, int] = {}
        for job in sim.waiting:  # pending pods naming the dataset
            demand[job.dataset] = demand.get(job.dataset, 0) + job.workers
        log = sim.started_log
        for started, dataset, workers in reversed(log):  # started within the window
            if started < sim.now - self.window_s:
                break
            demand[dataset] = demand.get(dataset, 0) + workers
        by_name = {n.name: n for n in sim.nodes}
        rooms: list[tuple[str, int, int]] | None = None  # per node: name, free bytes, free GPUs
        for name in dict.fromkeys([*demand, *self.held]):
            d = sim.datasets[name]
            key = (name, d.version_at(sim.now))
            old_key, before = self.held.get(name, (key, []))
            if old_key != key:  # a new version: the task now names it; the old one is released
                self._release(sim, [by_name[n] for n in before], old_key)
            goal = replication.target(replication.AUTO, demand.get(name, 0), max_auto=self.max_auto)
            if goal == 0 and not before:
                self.held.pop(name, None)
                continue
            if rooms is None:
                rooms = [(n.name, sim.params.cache_bytes - n.used_bytes, len(n.free)) for n in sim.nodes]
            holders = sim.ready_copies.get(key, set())
            # only the nodes choose() could pick (a copy, chosen before, or room and free GPUs):
            # the same answer, without a NodeRoom for each of the others
            need, kept = math.ceil(d.size * 1.2), set(before)
            here = [
                replication.NodeRoom(n, i in holders, free, gpus)
                for i, (n, free, gpus) in enumerate(rooms)
                if i in holders or n in kept or (free >= need and gpus > 0)
            ]
            chosen = replication.choose(here, goal, size_bytes=d.size, before=before)
            self._release(sim, [by_name[n] for n in before if n not in chosen], key)
            for node_name in chosen:
                node = by_name[node_name]
                entry = node.cache.get(key)
                if entry is None:
                    if not sim._make_room(node, d.size):  # room was checked: only a race of this pass
                        continue
                    entry = node.cache[key] = CacheEntry(name, key[1], d.size, sim.now, by_task="replica")
                    sim._fetch_version(node, key, d.size, cached=True, waiter=None)
                    sim.task_fetch_bytes["replica"] = sim.task_fetch_bytes.get("replica", 0) + d.size
                    sim.touch(node)
                    rooms[node.index] = (node.name, sim.params.cache_bytes - node.used_bytes, len(node.free))
                entry.replica = True
            if chosen:
                self.held[name] = (key, chosen)
            else:
                self.held.pop(name, None)

    @staticmethod
    def _release(sim: Cluster, nodes: list[Node], key: tuple[str, int]) -> None:
        for node in nodes:
            entry = node.cache.get(key)
            if entry is not None and entry.replica:
                entry.replica = False  # evictable at once, like any unused data
                sim.touch(node)


__all__ = ["RESYNC_S", "Cluster", "CopyCounts", "NextJobPreparation", "Replication"]
