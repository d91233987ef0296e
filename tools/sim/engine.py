"""A discrete-event simulator of a GPU cluster that runs the project's real scheduling code.

Who calls it: ``tools/sim/run.py``, ``tools/sim/sweep.py`` and ``tests/tools/test_sim.py``. It owns the cluster
state (free GPUs, node caches, fetches sharing storage bandwidth, running jobs), the event
loop and the measurements. It owns **no policy**: every decision is a call into the
product --

- filter and scores: :class:`scheduler_plugin.framework.Framework` (``filter``,
  ``prioritize``, ``job_class``) over :class:`scheduling.nodeinfo.NodeFacts` built
  from the simulated nodes, exactly what the extender computes from Node annotations;
- the GPUs a pod gets: ``gpu_topology.best_gpu_set`` (inside the job's RoCE class from
  ``gpu_topology.roce_classes``, or the job's class set: ``gpu_topology.classsets``); the
  baselines get what NVIDIA's device plugin hands out, go-gpuallocator's best-effort
  choice over the node's free GPUs (``best_gpu_set`` without classes);
- the node cache: the agent's pure eviction policy ``dsagent.cache.eviction.plan_for_fetch``
  (for ours cluster-aware: the copies other nodes hold, ``tools/sim/hooks.py``), its single
  flight per dataset version, and its rule that an old version goes when no task holds it;
- the Dataset controller's cluster-side policies, each in a variant of ours so that the
  sweep shows its effect on the same jobs: ``ours+prepare``, next-job preparation
  (``dsagent.cache.preparation``; also ``ClusterParams.prepare_next``), and
  ``ours+replicas``, replication with ``spec.replicas: auto`` for every dataset
  (``dsagent.cache.replication``), both through ``tools/sim/hooks.py``; their copies are
  fetched as the agent fetches any task's (P2P first) and held (in use) while the
  controller holds them;
- run times, plans and queue order: :mod:`scheduling.timemodel`;
- fetch time: bytes / throughput, the throughput being the agent's measured bundle unpack
  rate (README, Performance) per node, shared fairly on a storage system of
  ``storage_bw`` bytes/s; P2P as the agent does it (README, Peer-to-peer bundles): a
  version another node holds ready is read from it, and a node starting while another
  fetches the same version reads from that one as its bundles arrive. Ready copies per
  version are tracked (:meth:`Simulation.copies_elsewhere`) for cluster-aware eviction.

The two baselines are emulations of other systems: their scores in
:mod:`tools.sim.baselines`, Fluid's per-dataset cache runtimes in :mod:`tools.sim.fluid`;
the no-cache baseline reads as a direct-mode pod (streams while training, ``Fetch.stream``).

Time is in simulated seconds from 0. Deterministic for a seed: stdlib ``random.Random``
only, ties broken by that generator, dicts iterated in insertion order.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsagent.cache.eviction import Candidate, plan_for_fetch
from gpu_topology import Topology, best_gpu_set, roce_classes
from gpu_topology.classsets import NodeRoom, gpus_in_set, single_set_exists, single_set_placement
from gpu_topology.dumps import load_dump
from gpu_topology.scoring import single_numa
from scheduler_plugin.framework import Framework
from scheduler_plugin.jobs import JobClasses
from scheduler_plugin.settings import Settings, Weights
from scheduling.migration import RunningJob, plan_migrations
from scheduling.nodeinfo import Holding, Inventory, NodeFacts, RoceClassInfo
from scheduling.podspec import DatasetWant, PodRequest
from scheduling.timemodel import (
    DEFAULT_BANDWIDTHS,
    Decision,
    Plan,
    decide,
    intra_node_bandwidth,
    queue_order,
    t_run,
    wait_for_one_node,
)
from tools.sim import baselines, hooks
from tools.sim import deadline as deadline_variants
from tools.sim.fluid import FluidRuntimes
from tools.sim.workload import Dataset, Job

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "tests" / "fixtures" / "topology"
# ours with issue 25's cluster-side policies switched on: next-job preparation, replication
OURS_VARIANTS = ("ours+prepare", "ours+replicas")
OURS = ("ours", "ours+time", *OURS_VARIANTS)  # cluster-aware eviction, class sets
POLICIES = ("default", "fluid", "ours", *OURS_VARIANTS, *deadline_variants.POLICY_NAMES)
MEASURED_FETCH_BPS = 669e6  # dsagent unpack, every file verified (README, Performance)
EPOCH = 1_795_000_000.0  # simulated t=0 as wall-clock seconds (deadlines, JobClasses)


@dataclass(frozen=True)
class ClusterParams:
    nodes: int = 500
    node_types: tuple[tuple[str, float], ...] = (
        ("dgx-a100-class-8xA100-epyc7742-nps4-10nic-niclegend-nvidia-smi-topo-m.txt", 0.5),
        ("oneflow-hugectr-8xV100-2nic-mangled-whitespace-nvidia-smi-topo-m.txt", 0.3),
        ("dgx1-v100-4ib-nvidia-smi-topo-m.txt", 0.2),
    )
    cache_bytes: int = 4 * 10**12  # NVMe per node
    storage_bw: float = 20e9  # shared storage, bytes/s, all nodes together
    node_fetch_bw: float = MEASURED_FETCH_BPS
    cross_subnet_factor: float = 0.5  # ring bandwidth when a job's workers sit in different subnets
    queue_scan: int = 40  # waiting jobs tried per scheduling round
    prepare_next: bool = False  # opt-in: ours prepares waiting jobs' data (docs/design.md#next-job-preparation)
    plan_sizes: str = "pow2"  # GPU counts the time model may give a job: pow2 (1, 2, 4, ... up to the
    # count asked for, and that count) or "asked" (only the count asked for)
    node_counts: tuple[tuple[str, int], ...] = ()  # exact (fixture, count) list; when set it replaces
    # ``nodes`` and ``node_types``' shares (a workload file's ``nodes`` key)
    peers: bool = True  # ours: a version another node holds ready comes from that peer, not storage
    direct_epochs: float = 1.0  # passes over its dataset a no-cache (direct-mode) pod reads while training
    node_serve_bw: float = 3e9  # what one node serves to peers, all its uploads together (an NVMe's
    # sequential read, about a 25 Gb/s link): an assumption, not a measurement


@dataclass
class NodeType:
    name: str
    topology: Topology
    id: int
    classes: tuple[RoceClassInfo, ...]
    class_of: dict[int, str]


@dataclass
class CacheEntry:
    dataset: str
    version: int
    size: int
    last_used: float
    users: int = 0
    ready: bool = False
    prepared: bool = False  # held for a waiting job by next-job preparation: not evicted
    replica: bool = False  # held by the controller's replica task: in use, not evicted
    by_task: str = ""  # fetched for a controller task ("prepare", "replica"), until a pod first uses it

    @property
    def in_use(self) -> bool:
        return self.users > 0 or self.prepared or self.replica


@dataclass
class Node:
    index: int
    name: str
    type: NodeType
    free: set[int]
    cache: dict[tuple[str, int], CacheEntry] = field(default_factory=dict)
    labels: set[str] = field(default_factory=set)  # Fluid-style: ever cached here
    facts: NodeFacts | None = None

    @property
    def used_bytes(self) -> int:
        return sum(e.size for e in self.cache.values())


@dataclass
class Fetch:
    """Bytes moving to one node: from shared storage or from peers (other nodes' caches).

    ``stream``: the pod trains while these bytes arrive (a direct-mode or FUSE read); its
    first step does not wait for them, its end does. Otherwise the first step waits."""

    node: Node
    key: tuple[str, int]
    remaining: float
    cached: bool
    waiters: list[tuple[Job, int]] = field(default_factory=list)
    source: str = "storage"  # "storage" | "peer"
    stream: bool = False
    after: Fetch | None = None  # a peer fetch of bytes this other fetch is still bringing in
    sources: tuple[int, ...] = ()  # the nodes serving a peer fetch


@dataclass
class Worker:
    node: Node
    gpus: tuple[int, ...]
    classes: frozenset[str]
    hit: bool = False


@dataclass
class Outcome:
    job: Job
    start: float = math.nan
    first_step: float = math.nan
    end: float = math.nan
    workers: list[Worker] = field(default_factory=list)
    pending: int = 0
    spans_subnets: bool = False
    avoidable: bool = False  # spans subnets although one class set could hold it at its start
    numa_split: int = 0
    plan_gpus: int = 0
    streams: int = 0  # streaming reads still running (direct mode, Fluid-style FUSE reads)
    compute_end: float = math.nan  # when the GPUs' work is done; ``end`` waits for the streams too
    remaining: float = 1.0  # part of the work left when the (re)start's data is ready
    delay: float = 0.0  # checkpoint + restart of a move, before the first step on the new GPUs
    migrations: int = 0
    migratable: bool = False


def load_node_types(params: ClusterParams) -> list[tuple[NodeType, float]]:
    """The node types with their shares (``node_counts``: their counts)."""
    out = []
    listed = params.node_counts or params.node_types
    for i, (file, share) in enumerate(listed):
        topo = load_dump(TOPOLOGIES / file)
        classes = tuple(RoceClassInfo(c.name, frozenset(c.gpus)) for c in roce_classes(topo))
        class_of = {g: c.name for c in classes for g in c.gpus}
        out.append((NodeType(file.split("-nvidia")[0], topo, i, classes, class_of), float(share)))
    return out


def build_nodes(params: ClusterParams, seed: int) -> list[Node]:
    """The cluster's nodes: exact counts shuffled (``node_counts``), else drawn by share."""
    types = load_node_types(params)
    layout = random.Random(seed + 1)
    if params.node_counts:
        chosen = [t for t, count in types for _ in range(int(count))]
        layout.shuffle(chosen)
    else:
        chosen = [layout.choices([t for t, _ in types], [s for _, s in types])[0] for _ in range(params.nodes)]
    return [Node(i, f"node-{i:04d}", t, set(t.topology.gpu_indices)) for i, t in enumerate(chosen)]


class Simulation:
    """One policy over one workload."""

    def __init__(
        self, policy: str, jobs: Sequence[Job], datasets: Sequence[Dataset], params: ClusterParams, seed: int
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        self.policy = policy
        self.variant = deadline_variants.variant(policy)
        self.seed = seed
        self.params = params
        self.rng = random.Random(seed)
        self.jobs = list(jobs)
        self.datasets = {d.name: d for d in datasets}
        self.nodes: list[Node] = build_nodes(params, seed)
        self.now = 0.0
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.waiting: list[Job] = []
        self.outcomes = {j.id: Outcome(j, migratable=deadline_variants.migratable(j.id, seed)) for j in self.jobs}
        self.fetches: list[Fetch] = []
        self.inflight: dict[tuple[int, tuple[str, int]], Fetch] = {}
        self.storage_log: list[tuple[float, float]] = [(0.0, 0.0)]
        self.storage_bytes = 0.0
        self.storage_first_bytes = 0.0  # the first storage read of each version: no policy reads less
        self.storage_uncached_bytes = 0.0  # storage reads not kept (a miss with no room, direct mode)
        self.storage_seen: set[tuple[str, int]] = set()
        self.peer_bytes = 0.0  # bytes a node read from other nodes' caches (P2P, Fluid's workers)
        self.requests = self.hits = 0
        self.uncached_reads = 0  # misses the node could not make room for (read, not kept)
        # ready copies per dataset version: which nodes hold it (P2P sources; how many other
        # nodes hold a version, for a cluster-aware eviction policy: :meth:`copies_elsewhere`)
        self.ready_copies: dict[tuple[str, int], set[int]] = {}
        self.fluid = FluidRuntimes(params.cache_bytes)
        self.fluid_fills: dict[tuple[str, int], Fetch] = {}
        weights = Weights(dataset=0.5, roce=0.3, numa=0.2, time=0.0)
        if self.variant is not None:
            weights = Weights(dataset=0.4, roce=0.2, numa=0.2, time=0.2)
        self.framework = Framework(
            Settings(weights=weights),
            jobs=JobClasses(3600.0, clock=lambda: EPOCH + self.now),
            clock=lambda: EPOCH + self.now,
        )
        self.gpu_memo: dict[tuple[int, frozenset[int], int], tuple[int, ...] | None] = {}
        self.ideal_bw: dict[tuple[int, int], float] = {}
        self.bw_memo: dict[tuple[int, tuple[int, ...]], float] = {}  # (node type, GPUs) -> intra-node bandwidth
        self.running: dict[int, Outcome] = {}  # jobs whose data is ready, by id
        self.copy_counts = hooks.CopyCounts()  # cluster-aware eviction (tools/sim/hooks.py)
        self.next_job = hooks.NextJobPreparation()  # opt-in: params.prepare_next or "ours+prepare"
        self.prepare = policy == "ours+prepare" or (params.prepare_next and policy in ("ours", "ours+time"))
        self.replication = hooks.Replication() if policy == "ours+replicas" else None
        self.started_log: list[tuple[float, str, int]] = []  # (start, dataset, workers): demand
        self.task_fetch_bytes: dict[str, int] = {}  # bytes fetched for controller tasks, per kind
        self.task_used_bytes: dict[str, int] = {}  # of those, copies a pod then used on that node

    # -- node facts, as the extender would read them from the agents' annotations ---------

    def facts(self, node: Node) -> NodeFacts:
        if node.facts is None:
            held: dict[str, Holding] = {}
            if self.policy == "fluid":
                # Fluid-style labels: the dataset name only, no digest, never removed on eviction.
                held = {name: Holding(None, None, True, False) for name in node.labels}
            elif self.policy != "default":
                for (name, version), e in node.cache.items():
                    newest = held.get(name)
                    if newest is None or version > int(newest.digest or "0", 16):
                        held[name] = Holding(f"{version:032x}", e.size, e.ready, e.users > 0)
            free = frozenset(node.free)
            node.facts = NodeFacts(
                name=node.name,
                inventory=Inventory(self.params.cache_bytes, self._free_bytes(node), held),
                topology=node.type.topology,
                topology_id=node.type.id,
                classes=node.type.classes,
                allocatable_gpus=len(node.type.topology.gpus),
                published_free=free,
                gpu_facts_known=True,
            )
        return node.facts

    def touch(self, node: Node) -> None:
        node.facts = None

    def _free_bytes(self, node: Node) -> int:
        if self.policy == "fluid":
            return self.params.cache_bytes - self.fluid.committed.get(node.index, 0)
        return self.params.cache_bytes - node.used_bytes

    # -- the node caches' cluster-wide view -----------------------------------------------

    def copies_elsewhere(self, node: Node, key: tuple[str, int]) -> int:
        """How many other nodes hold this dataset version ready (what the controller reads
        from the node inventories)."""
        holders = self.ready_copies.get(key, ())
        return len(holders) - (1 if node.index in holders else 0)

    def _forget(self, node: Node, key: tuple[str, int]) -> None:
        """Drop a cached version from a node (evicted or replaced)."""
        node.cache.pop(key, None)
        holders = self.ready_copies.get(key)
        if holders is not None:
            holders.discard(node.index)
            if not holders:
                del self.ready_copies[key]

    # -- events -------------------------------------------------------------------------

    def push(self, t: float, kind: str, ident: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, ident))

    def run(self) -> Simulation:
        for job in self.jobs:
            self.push(job.arrival, "arrive", job.id)
        by_id = {j.id: j for j in self.jobs}
        while self.events or self.fetches:
            t_event = self.events[0][0] if self.events else math.inf
            t_fetch, rate = self._next_fetch()
            t = min(t_event, t_fetch)
            self._progress(t - self.now, rate)
            self.now = t
            if t_fetch <= t_event:
                self._finish_fetches()
            else:
                _, _, kind, ident = heapq.heappop(self.events)
                if kind == "arrive":
                    self.waiting.append(by_id[ident])
                elif kind == "end" and self.outcomes[ident].compute_end == t:  # not the end before a move
                    self._compute_done(self.outcomes[ident])
            if not self.events or self.events[0][0] > self.now:
                self.schedule()
                if self.prepare:
                    self.next_job(self)
                if self.replication is not None:
                    self.replication(self)
        return self

    def _rate(self, fetch: Fetch, per_node: dict[int, int], from_storage: int, uploads: dict[int, int]) -> float:
        """Fair shares: the node's fetch rate among its fetches; storage's among storage
        fetches; each serving node's upload rate among the peer reads it serves (a read
        from several sources gets its share of each)."""
        p = self.params
        node_share = p.node_fetch_bw / per_node[fetch.node.index]
        if fetch.source == "peer":
            if not fetch.sources:
                return node_share
            return min(node_share, sum(p.node_serve_bw / uploads[s] for s in fetch.sources))
        return min(node_share, p.storage_bw / from_storage)

    def _next_fetch(self) -> tuple[float, dict[int, float]]:
        if not self.fetches:
            return math.inf, {}
        per_node: dict[int, int] = {}
        for f in self.fetches:
            per_node[f.node.index] = per_node.get(f.node.index, 0) + 1
        from_storage = sum(1 for f in self.fetches if f.source == "storage")
        uploads: dict[int, int] = {}
        for f in self.fetches:
            for source in f.sources:
                uploads[source] = uploads.get(source, 0) + 1
        rates = {id(f): self._rate(f, per_node, from_storage, uploads) for f in self.fetches}
        # a peer serving bytes it is still fetching passes them on no faster than they come
        active = {id(f) for f in self.fetches}
        for f in self.fetches:
            if f.after is not None and id(f.after) in active:
                rates[id(f)] = min(rates[id(f)], rates[id(f.after)])
        soonest = min(f.remaining / rates[id(f)] for f in self.fetches)
        return self.now + soonest, rates

    def _progress(self, dt: float, rates: dict[int, float]) -> None:
        if dt <= 0 or not rates:
            return
        for f in self.fetches:
            f.remaining -= rates[id(f)] * dt

    def _finish_fetches(self) -> None:
        done = [f for f in self.fetches if f.remaining <= 1.0]
        self.fetches = [f for f in self.fetches if f.remaining > 1.0]
        for f in done:
            entry = f.node.cache.get(f.key)
            if f.cached and self.policy == "fluid":
                self.fluid.filled(f.key)
                self.fluid_fills.pop(f.key, None)
            elif f.cached and entry is not None:
                entry.ready = True
                f.node.labels.add(f.key[0])
                self.ready_copies.setdefault(f.key, set()).add(f.node.index)
                self._drop_old_versions(f.node, f.key)
                self.touch(f.node)
            self.inflight.pop((f.node.index, f.key), None)
            for job, _ in f.waiters:
                if f.stream:
                    self._stream_done(self.outcomes[job.id])
                else:
                    self._data_ready(self.outcomes[job.id])

    # -- scheduling -----------------------------------------------------------------------

    def schedule(self) -> None:
        if not self.waiting:
            return
        window = self.waiting[: self.params.queue_scan]
        if self.variant is not None:
            if self.variant.migrate:
                self._migrate()
            self._schedule_by_plans(window)
            return
        for job in window:
            if self._place_gang(job):
                self.waiting.remove(job)

    def _can_fit(self, per_worker: int, workers: int) -> bool:
        return (
            sum(1 for n in self.nodes if len(n.free) >= per_worker) >= 1
            and sum(len(n.free) // per_worker for n in self.nodes) >= workers
        )

    def _pod(self, job: Job, gpus: int, workers: int | None = None) -> PodRequest:
        """The pod the extender sees: ``workers`` is the job's worker count (its shape's)."""
        d = self.datasets[job.dataset]
        profile = job.profile if workers is None else replace(job.profile, workers=workers)
        digest = None if self.policy == "fluid" else f"{d.version_at(self.now):032x}"
        return PodRequest(
            key=f"sim/job-{job.id}",
            namespace="sim",
            datasets=(DatasetWant(job.dataset, digest),),
            gpus=gpus,
            job=f"sim/job-{job.id}",
            time=profile,
            workers=workers if workers is not None else job.workers,
        )

    def _choose(self, job: Job, gpus: int, exclude: set[int], workers: int) -> Node | None:
        """The node kube-scheduler would bind one worker to under this policy."""
        candidates = [n for n in self.nodes if len(n.free) >= gpus and n.index not in exclude]
        if not candidates:
            return None
        facts = [self.facts(n) for n in candidates]
        if self.policy == "default":
            scores = baselines.least_allocated(facts)
        elif self.policy == "fluid":
            scores = baselines.fluid(self._pod(job, gpus), facts)
        else:
            pod = self._pod(job, gpus, workers)
            outcome = self.framework.filter(
                pod, [f.name for f in facts], facts, lambda: (self.facts(n) for n in self.nodes)
            )
            passed = set(outcome.passed)
            keep = [i for i, f in enumerate(facts) if f.name in passed]
            candidates = [candidates[i] for i in keep]
            facts = [facts[i] for i in keep]
            if not candidates:
                return None
            scores = self.framework.prioritize(pod, facts, lambda: (self.facts(n) for n in self.nodes))
        best = max(scores)
        top = [n for n, s in zip(candidates, scores) if s == best]
        return top[self.rng.randrange(len(top))]

    def _gpus_for(self, job: Job, node: Node, count: int, workers: int = 1) -> tuple[int, ...] | None:
        free = sorted(node.free)
        if len(free) < count:
            return None
        if self.policy in ("default", "fluid"):
            return self._nvidia_choice(node, count)
        pod = self._pod(job, count, workers)
        cluster = lambda: (self.facts(n) for n in self.nodes)  # noqa: E731
        job_set = self.framework.job_set(pod, cluster)
        if job_set is not None and job_set.classes:
            classes = {c.name: c.gpus for c in node.type.classes}
            in_set = gpus_in_set(node.type.topology, classes, free, job_set.classes, count)
            if in_set is not None:
                return in_set
        gpu_class = self.framework.job_class(pod, cluster)
        pool = frozenset(free)
        if gpu_class is not None:
            in_class = frozenset(g for g in free if node.type.class_of.get(g) == gpu_class)
            if len(in_class) >= count:
                pool = in_class
        key = (node.type.id, pool, count)
        if key not in self.gpu_memo:
            best = best_gpu_set(node.type.topology, pool, count)
            self.gpu_memo[key] = tuple(best.gpus) if best else None
        return self.gpu_memo[key]

    def _nvidia_choice(self, node: Node, count: int) -> tuple[int, ...]:
        """What NVIDIA's device plugin gives a pod of the baselines: its GetPreferredAllocation
        is go-gpuallocator's best-effort policy over the node's free GPUs, which
        ``gpu_topology.best_gpu_set`` reproduces (tests/gpu_topology/test_go_gpuallocator.py);
        when it names no set, the kubelet's own pick, the lowest free indices."""
        key = (node.type.id, frozenset(node.free), -count)  # negative: apart from our policies' keys
        if key not in self.gpu_memo:
            best = best_gpu_set(node.type.topology, node.free, count)
            self.gpu_memo[key] = tuple(best.gpus) if best else tuple(sorted(node.free)[:count])
        return self.gpu_memo[key] or ()

    def _place_gang(self, job: Job, shape: Sequence[tuple[Node | None, int]] | None = None) -> bool:
        """Bind every worker or none (gang scheduling). ``shape``: a plan's (node, GPUs)."""
        if shape is None:
            if not self._can_fit(job.gpus_per_worker, job.workers):
                return False
            shape = [(None, job.gpus_per_worker)] * job.workers
        placed: list[Worker] = []
        used: set[int] = set()
        rooms = self._rooms() if len(shape) > 1 else []
        in_set = self._single_set(job, shape, rooms)
        for slot, (fixed, count) in enumerate(shape):
            node = fixed if fixed is not None else self._choose(job, count, used, len(shape))
            gpus = self._gpus_for(job, node, count, len(shape)) if node is not None else None
            if in_set is not None:
                node, gpus = in_set[slot]
            if node is None or gpus is None:
                for w in placed:
                    w.node.free.update(w.gpus)
                    self.touch(w.node)
                self.framework.jobs.forget(f"sim/job-{job.id}")  # nothing placed: choose afresh
                return False
            node.free.difference_update(gpus)
            self.touch(node)
            used.add(node.index)
            classes = frozenset(node.type.class_of.get(g, "none") for g in gpus)
            placed.append(Worker(node, gpus, classes))
        self._start(job, placed)
        out = self.outcomes[job.id]
        if out.spans_subnets:
            out.avoidable = single_set_exists(rooms, [count for _, count in shape])
        return True

    def _single_set(
        self, job: Job, shape: Sequence[tuple[Node | None, int]], rooms: list[NodeRoom]
    ) -> list[tuple[Node, tuple[int, ...] | None]] | None:
        """For our policies, a time-model plan across fixed nodes whose workers would not
        share one class set is moved to nodes that hold it in one set, when some do
        (docs/design.md#class-sets); None: keep the plan's nodes. The deadline variants run
        with the project's rules get it too (the webhook chooses a job's set whatever plans
        it); the design as written (``deadline-design``) does not."""
        if self.policy in ("default", "fluid") or len(shape) < 2 or any(n is None for n, _ in shape):
            return None
        if self.variant is not None and self.variant.as_written:
            return None
        sets = set()
        for fixed, count in shape:
            assert fixed is not None
            gpus = self._gpus_for(job, fixed, count, len(shape)) or ()
            sets.add(frozenset(fixed.type.class_of.get(g, "none") for g in gpus))
        if len(sets) == 1:
            return None
        found = single_set_placement(rooms, [count for _, count in shape])
        if found is None:
            return None
        class_set, where = found
        out = []
        for (_, count), index in zip(shape, where):
            node = self.nodes[index]
            classes = {c.name: c.gpus for c in node.type.classes}
            out.append((node, gpus_in_set(node.type.topology, classes, node.free, class_set, count)))
        return out

    def _rooms(self) -> list[NodeRoom]:
        """Every node's class sizes and free GPUs per class, as the class-set rules read them."""
        return [
            NodeRoom(
                {c.name: len(c.gpus) for c in n.type.classes}, {c.name: len(c.gpus & n.free) for c in n.type.classes}
            )
            for n in self.nodes
        ]

    def _schedule_by_plans(self, window: list[Job]) -> None:
        """Steps 3-6 of the deadline design: a plan per waiting job, the queue in the
        design's order, one job placed per round, until nothing more fits."""
        while window:
            free = {n.name: len(n.free) for n in self.nodes if n.free}
            if not free:
                return
            by_name = {n.name: n for n in self.nodes}
            decisions = {job.id: self._decide(job, free, by_name) for job in window}
            order = queue_order((str(j), d) for j, d in decisions.items())
            placed = False
            for ident in order:
                job = next(j for j in window if str(j.id) == ident)
                d = decisions[job.id]
                if d.plan is None:
                    continue
                as_written = self.variant is not None and self.variant.as_written
                if d.plan.cross_node and not as_written and self._better_to_wait(job, d.plan):
                    continue
                if d.plan.cross_node:
                    shape: list[tuple[Node | None, int]] = [(by_name[n], c) for n, c in d.plan.allocation]
                else:
                    shape = [(None, d.plan.n_gpu)]  # the extender picks the node
                if self._place_gang(job, shape):
                    self.outcomes[job.id].plan_gpus = d.plan.n_gpu
                    window.remove(job)
                    self.waiting.remove(job)
                    placed = True
                    break
            if not placed:
                return

    def _better_to_wait(self, job: Job, plan: Plan) -> bool:
        """The time model's wait rule: the earliest time a node will hold the plan's GPUs,
        from the running jobs' expected ends, and the run time on that node."""
        n = plan.n_gpu
        best_t, best_run = math.inf, math.inf
        releases: dict[int, list[tuple[float, int]]] = {}
        for out in self.running.values():
            for w in out.workers:
                releases.setdefault(w.node.index, []).append((out.end, len(w.gpus)))
        for node in self.nodes:
            if len(node.type.topology.gpus) < n:
                continue
            free, t = len(node.free), self.now
            for end, count in sorted(releases.get(node.index, ())):
                if free >= n:
                    break
                free, t = free + count, end
            if free >= n and t < best_t:
                ideal = self.ideal_bw.get((node.type.id, n))
                if ideal is None:
                    best = best_gpu_set(node.type.topology, node.type.topology.gpu_indices, n)
                    ideal = self.ideal_bw[(node.type.id, n)] = intra_node_bandwidth(
                        node.type.topology, best.gpus if best else ()
                    )
                best_t, best_run = t, t_run(job.profile, n, ideal)
        return wait_for_one_node(plan, best_run, best_t)

    def _node_bandwidth(self, node: Node, gpus: tuple[int, ...]) -> float:
        """``intra_node_bandwidth`` of a GPU set, memoised per node type (a pure function of both)."""
        key = (node.type.id, gpus)
        bw = self.bw_memo.get(key)
        if bw is None:
            bw = self.bw_memo[key] = intra_node_bandwidth(node.type.topology, gpus)
        return bw

    def _decide(self, job: Job, free: dict[str, int], by_name: dict[str, Node]) -> Decision:
        # the GPUs a plan's share of a node would get: nothing changes while one job is decided,
        # so each (node, count) is asked of the product once (the same answers, far fewer calls)
        chosen: dict[tuple[str, int], tuple[int, ...]] = {}

        def gpus_of(name: str, count: int) -> tuple[int, ...]:
            if (name, count) not in chosen:
                chosen[(name, count)] = self._gpus_for(job, by_name[name], count) or ()
            return chosen[(name, count)]

        def bandwidth_of(allocation: tuple[tuple[str, int], ...]) -> float:
            per_node = [self._node_bandwidth(by_name[name], gpus_of(name, count)) for name, count in allocation]
            weakest = min(per_node)
            if len(per_node) == 1:
                return weakest
            classes = {frozenset(by_name[n].type.class_of.get(g, "none") for g in gpus_of(n, c)) for n, c in allocation}
            factor = self.params.cross_subnet_factor if len(classes) > 1 else 1.0
            return min(weakest, DEFAULT_BANDWIDTHS.network * factor)

        d = self.datasets[job.dataset]
        key = (d.name, d.version_at(self.now))

        def start_of(allocation: tuple[tuple[str, int], ...]) -> float:
            """When the dataset is on every node of the plan: at once where a ready copy is,
            else after a fetch sharing storage with the fetches running and the plan's own."""
            missing = sum(1 for n, _ in allocation if not (e := by_name[n].cache.get(key)) or not e.ready)
            if not missing:
                return self.now
            rate = min(self.params.node_fetch_bw, self.params.storage_bw / (len(self.fetches) + missing))
            return self.now + d.size / rate

        # best-fit ties go to nodes holding the data (the extender's dataset affinity)
        pod = self._pod(job, 1)
        holders = [n for n in self.nodes if n.free and job.dataset in self.facts(n).held]
        affinity = self.framework.dataset_scores(pod, [self.facts(n) for n in holders])
        prefer = {n.name: float(a) for n, a in zip(holders, affinity)}
        variant = self.variant
        over_free = variant is not None and variant.over_free
        # plans over the free GPUs (design, step 3.2) or capped at the GPUs asked for (ours+time)
        most = min(deadline_variants.MAX_PLAN_GPUS, sum(free.values())) if over_free else job.gpus
        sizes = [job.gpus]
        if self.params.plan_sizes == "pow2" or over_free:
            sizes += [2**k for k in range(10) if 2**k <= most]
        return decide(
            job.profile,
            free,
            bandwidth_of,
            now=self.now,
            max_gpus=max(most, job.gpus),
            sizes=sizes,
            start_of=start_of,
            prefer=prefer,
            formula=variant.formula if variant is not None else "slack-per-gpu",
            as_written=variant is not None and variant.as_written,
        )

    def _migrate(self) -> None:
        """Step 5 before the round: the product's migration policy over the running jobs that
        checkpoint; a move evicts the job's workers and re-places them, its cost modelled as
        checkpoint + restart + the data re-fetch on a node without the data."""
        running = []
        for out in self.running.values():
            if not out.migratable or out.end <= self.now or math.isnan(out.first_step):
                continue
            began = out.first_step + out.delay
            span = out.end - began
            done = (self.now - began) / span if span > 0 else 1.0
            left = out.remaining * (1.0 - min(1.0, max(0.0, done)))
            if left <= 0.01:
                continue
            allocation = tuple((w.node.name, len(w.gpus)) for w in out.workers)
            running.append(RunningJob(str(out.job.id), out.job.profile, allocation, out.end, left, True))
        if not running:
            return
        by_name = {n.name: n for n in self.nodes}
        free = {n.name: len(n.free) for n in self.nodes if n.free}
        by_id = {str(o.job.id): o for o in self.running.values()}

        def bandwidth_of(moving: RunningJob, allocation: tuple[tuple[str, int], ...]) -> float:
            name, count = allocation[0]
            gpus = self._gpus_for(by_id[moving.name].job, by_name[name], count) or ()
            return intra_node_bandwidth(by_name[name].type.topology, gpus)

        def cost_of(job: RunningJob, target: tuple[tuple[str, int], ...]) -> float:
            d = self.datasets[by_id[job.name].job.dataset]
            key = (d.name, d.version_at(by_id[job.name].start))
            entry = by_name[target[0][0]].cache.get(key)
            refetch = 0 if entry is not None and entry.ready else d.size
            rate = min(self.params.node_fetch_bw, self.params.storage_bw / (len(self.fetches) + 1))
            return deadline_variants.move_cost(refetch, rate)

        for move in plan_migrations(running, free, bandwidth_of, cost_of, now=self.now):
            out = by_id[move.job]
            left = next(j.remaining for j in running if j.name == move.job)
            self._release_workers(out)
            self.running.pop(out.job.id, None)
            node = by_name[move.target[0][0]]
            gpus = self._gpus_for(out.job, node, move.target[0][1])
            if gpus is None:  # cannot happen: the policy counted this node's free GPUs
                continue
            node.free.difference_update(gpus)
            self.touch(node)
            classes = frozenset(node.type.class_of.get(g, "none") for g in gpus)
            out.workers = [Worker(node, gpus, classes)]
            out.pending = 1
            out.remaining = left
            out.delay = deadline_variants.CHECKPOINT_S + deadline_variants.RESTART_S
            out.migrations += 1
            out.spans_subnets = False
            out.end = out.compute_end = math.nan  # the old end event is stale
            self._request_data(out.job, out.workers[0], 0)

    # -- running ----------------------------------------------------------------------------

    def _start(self, job: Job, workers: list[Worker]) -> None:
        out = self.outcomes[job.id]
        out.start = self.now
        out.workers = workers
        out.pending = len(workers)
        out.plan_gpus = out.plan_gpus or job.gpus
        if len(workers) > 1:
            out.spans_subnets = len({w.classes for w in workers}) > 1
        if math.isnan(out.first_step):
            self.started_log.append((self.now, job.dataset, len(workers)))
        out.numa_split = sum(1 for w in workers if len(w.gpus) > 1 and not single_numa(w.node.type.topology, w.gpus))
        for index, w in enumerate(workers):
            self._request_data(job, w, index)

    def _request_data(self, job: Job, worker: Worker, index: int) -> None:
        d = self.datasets[job.dataset]
        key = (d.name, d.version_at(self.outcomes[job.id].start))  # a moved job keeps its version
        node = worker.node
        self.requests += 1
        if self.policy == "default":  # no cache: a direct-mode pod streams from storage as it trains
            size = int(d.size * self.params.direct_epochs)
            self._new_fetch(node, key, size, cached=False, waiter=(job, index), stream=True)
            return
        if self.policy == "fluid":
            self._request_fluid(job, worker, index, key, d.size)
            return
        entry = node.cache.get(key)
        if entry is not None and entry.by_task:  # a controller task's copy a pod now uses
            self.task_used_bytes[entry.by_task] = self.task_used_bytes.get(entry.by_task, 0) + entry.size
            entry.by_task = ""
        if entry is not None:
            entry.users += 1
            entry.last_used = self.now
            self.touch(node)
            if entry.ready:
                self.hits += 1
                worker.hit = True
                self._data_ready(self.outcomes[job.id])
            else:
                self.inflight[(node.index, key)].waiters.append((job, index))
            return
        victims_ok = self._make_room(node, d.size)
        self.uncached_reads += not victims_ok
        if victims_ok:
            node.cache[key] = CacheEntry(d.name, key[1], d.size, self.now, users=1)
            self.touch(node)
        self._fetch_version(node, key, d.size, cached=victims_ok, waiter=(job, index))

    def _fetch_version(
        self, node: Node, key: tuple[str, int], size: int, *, cached: bool, waiter: tuple[Job, int] | None
    ) -> None:
        """A fetch by ours' agent, for a pod or a controller task (preparation, replica):
        peer-to-peer first, as the agent does for every fetch: a version another agent holds
        ready is read from it, not from storage (or from a peer still fetching it, bundle by
        bundle, as agents starting together do); its bundle requests are spread over every
        peer that holds it."""
        source, after, sources = "storage", None, ()
        if self.params.peers and self.copies_elsewhere(node, key) > 0:
            source, sources = "peer", tuple(sorted(self.ready_copies[key] - {node.index}))
        elif self.params.peers:
            after = next((f for (i, k), f in self.inflight.items() if k == key and i != node.index), None)
            if after is not None:
                source, sources = "peer", (after.node.index,)
        self._new_fetch(node, key, size, cached=cached, waiter=waiter, source=source, sources=sources)
        if after is not None:
            self.fetches[-1].after = after

    def _request_fluid(self, job: Job, worker: Worker, index: int, key: tuple[str, int], size: int) -> None:
        """Fluid-style: the dataset's own cache runtime on the nodes it picked (tools/sim/fluid.py);
        pods read through FUSE as they train (a stream), locally where a worker holds the copy."""
        node = worker.node
        created, read = self.fluid.read(key, size, node.index, self._fluid_room)
        for w in created:
            self.nodes[w].labels.add(key[0])  # Fluid labels the nodes its cache workers run on
            self.touch(self.nodes[w])
        if read == "local":
            self.hits += 1
            worker.hit = True
            self._data_ready(self.outcomes[job.id])
            return
        if read == "fill":  # the runtime reads the new version from storage and keeps it
            self._new_fetch(node, key, size, cached=True, waiter=(job, index), stream=True)
            self.fluid_fills[key] = self.fetches[-1]
        elif read == "remote":  # from the runtime's cache workers over the network
            workers = self.fluid.runtimes[key[0]].workers
            sources = tuple(w for w in workers if w != node.index) or workers
            self._new_fetch(
                node, key, size, cached=False, waiter=(job, index), source="peer", stream=True, sources=sources
            )
            fill = self.fluid_fills.get(key)  # present while the fill runs
            if fill is not None:
                self.fetches[-1].after = fill  # reads through a fill no faster than it comes
        else:  # no room for a runtime anywhere: every read goes to storage
            self._new_fetch(node, key, size, cached=False, waiter=(job, index), stream=True)

    def _fluid_room(self) -> list[tuple[int, int]]:
        """(node index, uncommitted cache bytes) of every node, for a new runtime's workers."""
        return [(n.index, self.params.cache_bytes - self.fluid.committed.get(n.index, 0)) for n in self.nodes]

    def _make_room(self, node: Node, size: int) -> bool:
        aware = self.policy in OURS
        candidates = [
            Candidate(
                name,
                f"{version:032x}",
                e.size,
                e.last_used,
                in_use=e.in_use,
                fetching=not e.ready,
                copies=self.copy_counts.others(self, (name, version), e.ready) if aware else None,
            )
            for (name, version), e in node.cache.items()
        ]
        plan = plan_for_fetch(candidates, size=size, free=self.params.cache_bytes - node.used_bytes)
        if not plan.sufficient:
            return False
        for victim in plan.victims:
            self._forget(node, (victim.name, int(victim.digest, 16)))
        return True

    def _drop_old_versions(self, node: Node, key: tuple[str, int]) -> None:
        for other in [k for k, e in node.cache.items() if k[0] == key[0] and k[1] < key[1] and not e.in_use]:
            self._forget(node, other)

    def _new_fetch(
        self,
        node: Node,
        key: tuple[str, int],
        size: int,
        *,
        cached: bool,
        waiter: tuple[Job, int] | None,
        source: str = "storage",
        stream: bool = False,
        sources: tuple[int, ...] = (),
    ) -> None:
        fetch = Fetch(
            node, key, float(size), cached, [waiter] if waiter is not None else [], source, stream, sources=sources
        )
        self.fetches.append(fetch)
        if cached and self.policy != "fluid":
            self.inflight[(node.index, key)] = fetch
        if stream:
            out = self.outcomes[waiter[0].id]
            out.streams += 1
            self._data_ready(out)  # trains while the bytes arrive
        if source == "peer":
            self.peer_bytes += size
            return
        self.storage_bytes += size
        if key not in self.storage_seen:
            self.storage_seen.add(key)
            self.storage_first_bytes += size
        if not cached:
            self.storage_uncached_bytes += size
        self.storage_log.append((self.now, self.storage_bytes))

    def _data_ready(self, out: Outcome) -> None:
        out.pending -= 1
        if out.pending > 0:
            return
        if math.isnan(out.first_step):
            out.first_step = self.now
        job = out.job
        n = sum(len(w.gpus) for w in out.workers)
        bw = min(intra_node_bandwidth(w.node.type.topology, w.gpus) for w in out.workers)
        if len(out.workers) > 1:
            net = DEFAULT_BANDWIDTHS.network * (self.params.cross_subnet_factor if out.spans_subnets else 1.0)
            bw = min(bw, net)
        out.end = out.compute_end = self.now + out.delay + t_run(job.profile, n, bw) * out.remaining
        self.running[job.id] = out
        self.push(out.end, "end", job.id)

    def _compute_done(self, out: Outcome) -> None:
        """The job's steps are done; it ends when its streaming reads are done too."""
        if out.streams > 0:
            out.end = math.inf  # still reading: ends at the last stream's end
            return
        self._release(out)

    def _stream_done(self, out: Outcome) -> None:
        out.streams -= 1
        if out.streams == 0 and out.end == math.inf:
            out.end = self.now
            self._release(out)

    def _release(self, out: Outcome) -> None:
        self.running.pop(out.job.id, None)
        self._release_workers(out)

    def _release_workers(self, out: Outcome) -> None:
        d = self.datasets[out.job.dataset]
        for w in out.workers:
            w.node.free.update(w.gpus)
            for key, e in list(w.node.cache.items()):
                if key[0] == d.name and e.users > 0 and key[1] == d.version_at(out.start):
                    e.users -= 1
                    e.last_used = self.now
                    newer = [k for k in w.node.cache if k[0] == d.name and k[1] > key[1]]
                    if e.users == 0 and newer:
                        self._forget(w.node, key)  # an old version goes when no task holds it
            self.touch(w.node)


__all__ = ["ClusterParams", "EPOCH", "MEASURED_FETCH_BPS", "POLICIES", "Simulation", "load_node_types"]
