"""The state one simulation holds, and the small rules over it every part of the engine uses.

Who calls it: :class:`tools.sim.engine.Simulation`, which is this state with the
behaviour of :mod:`tools.sim.placement` (where jobs go), :mod:`tools.sim.flows` (bytes
moving at shared rates) and :mod:`tools.sim.reads` (what each policy reads from where)
mixed in. It owns the constructor, the node facts the extender reads, the event queue
and the cluster-wide view of ready copies.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler_plugin.framework import Framework
from scheduler_plugin.jobs import JobClasses
from scheduler_plugin.settings import Settings, Weights
from scheduling.nodeinfo import Holding, Inventory, NodeFacts, StripeHolding
from tools.sim import fluid, hooks, policies, rates
from tools.sim.cluster import EPOCH, ClusterParams, Fetch, Node, Outcome, Worker, build_nodes
from tools.sim.fluid import FluidRuntimes
from tools.sim.juicefs import CacheGroup
from tools.sim.policies import BASELINES, POLICIES
from tools.sim.stripe import Group
from tools.sim.workload import Dataset, Job

# why bytes were read from the store: the first read of a version's bytes kept in a cache
# (a whole copy, a group's bundles, Fluid's or JuiceFS's blocks); a read, kept again, of
# bytes the cluster had read and kept before (the copy or share was evicted, or another
# copy came from the store); a lost stripe member's bundles no node could take (a hole);
# a read nobody keeps (no cache, no room)
STORE_CAUSES = ("first_fill", "refetch", "lost_member", "uncached")


@dataclass
class FlowCounts:
    """The open transfers counted by what they share (tools/sim/flows.py): per node its local
    reads (``disk``), network transfers (``net``), store reads (``store``), unpacking fetches
    (``unpack``) and the peer reads it serves (``uploads``); the store reads of the cluster;
    and which of those changed since the rates were last computed."""

    disk: dict[int, int] = field(default_factory=dict)
    net: dict[int, int] = field(default_factory=dict)
    store: dict[int, int] = field(default_factory=dict)
    unpack: dict[int, int] = field(default_factory=dict)
    uploads: dict[int, int] = field(default_factory=dict)
    from_storage: int = 0
    dirty_nodes: set[int] = field(default_factory=set)
    dirty_uploads: set[int] = field(default_factory=set)
    storage_changed: bool = False


class SimState:
    """One policy over one workload: the state (see :class:`tools.sim.engine.Simulation`)."""

    def __init__(
        self, policy: str, jobs: Sequence[Job], datasets: Sequence[Dataset], params: ClusterParams, seed: int
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        self.policy = policy
        self.variant = policies.variant(policy)
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
        self.unschedulable: set[int] = set()  # waiting jobs tried and not placed (PodScheduled False)
        self.outcomes = {j.id: Outcome(j, migratable=policies.migratable(j.id, seed)) for j in self.jobs}
        self.epochs_capped = 0  # jobs whose derived epochs max_epochs lowered
        for out in self.outcomes.values():
            out.epochs = self._epochs(out.job)
        self.fetches: list[Fetch] = []  # the open transfers, in the order they opened
        self.after_fetches: list[Fetch] = []  # of those, the ones following another (``after``)
        self.flow_counts = FlowCounts()
        self.inflight: dict[tuple[int, tuple[str, int]], Fetch] = {}
        self.storage_log: list[tuple[float, float]] = [(0.0, 0.0)]
        self.storage_bytes = 0.0
        self.storage_first_bytes = 0.0  # the first storage read of each version: no policy reads less
        self.storage_uncached_bytes = 0.0  # storage reads not kept (a miss with no room, direct reads)
        self.storage_seen: set[tuple[str, int]] = set()
        # store reads by cause (:data:`STORE_CAUSES`), and per version the bytes read from
        # the store and kept in a cache, which tells a first fill from a fetch again
        self.storage_by_cause: dict[str, float] = dict.fromkeys(STORE_CAUSES, 0.0)
        self.storage_kept: dict[tuple[str, int], float] = {}
        self.peer_bytes = 0.0  # bytes between nodes: P2P and stripe fills, reads from other nodes' caches
        # training reads (what the pods read, all epochs): total, from the node's own disk,
        # from other nodes, from the store; [0] the first epoch, [1] the epochs after it
        self.read_bytes = [0.0, 0.0]
        self.read_local = [0.0, 0.0]
        self.read_peer = [0.0, 0.0]
        self.read_store = [0.0, 0.0]
        self.requests = self.hits = 0
        # (node, version) -> the ranks that read it locally once the node's copy is whole
        self.whole_pending: dict[tuple[int, tuple[str, int]], list[tuple[Outcome, int]]] = {}
        # (node, version) -> bytes its readers took through the window (the inventory's windowBytes)
        self.window_read: dict[tuple[int, tuple[str, int]], float] = {}
        self.whole_replans = 0  # a job's node asked to hold whole a version it read through a group
        self.lapsed_shares = 0  # superseded versions' groups whose shares lapsed, read by nobody
        self.replanned_at = -float("inf")  # the controller's last pass over the groups (ours+stripe)
        self.uncached_reads = 0  # misses the node could not make room for (read, not kept)
        # ready copies per dataset version: which nodes hold it (P2P sources; how many other
        # nodes hold a version, for a cluster-aware eviction policy: :meth:`copies_elsewhere`)
        self.ready_copies: dict[tuple[str, int], set[int]] = {}
        self.fluid = FluidRuntimes.for_policy(
            policy if policy in fluid.POLICIES else "fluid", params.cache_bytes, params.fluid_quota_bytes
        )
        group = params.juicefs_group_nodes or len(self.nodes)
        members = frozenset(range(min(group, len(self.nodes))))
        self.juicefs = CacheGroup(members, float(params.cache_bytes) * len(members))
        self.stripes: dict[tuple[str, int], Group] = {}
        # (node, version) -> the job's nodes copying that version whole together (ours+stripe):
        # each reads its own part from the store and the rest from the others
        self.copy_team: dict[tuple[int, tuple[str, int]], tuple[int, ...]] = {}
        self.owner_memo: dict[tuple[tuple[str, int], tuple[int, ...]], dict[int, float]] = {}
        weights = Weights(dataset=0.5, roce=0.3, numa=0.2, time=0.0)
        if self.variant is not None:
            weights = Weights(dataset=0.4, roce=0.2, numa=0.2, time=0.2)
        by_name = {n.name: n for n in self.nodes}
        self.framework = Framework(
            Settings(weights=weights),
            jobs=JobClasses(3600.0, clock=lambda: EPOCH + self.now),
            clock=lambda: EPOCH + self.now,
            node=lambda name: self.facts(by_name[name]) if name in by_name else None,  # the watch cache
        )
        self.gpu_memo: dict[tuple[int, frozenset[int], int], tuple[int, ...] | None] = {}
        self.names_memo: dict[tuple[int, ...], tuple[str, ...]] = {}
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

    def _epochs(self, job: Job) -> float:
        """A job's passes over its dataset: the workload's fixed count, else from its run time
        (:func:`rates.epochs`), lowered to ``max_epochs`` where set (and counted)."""
        if self.params.epochs is not None:
            return self.params.epochs
        size = self.datasets[job.dataset].size
        mix = self.params.gpu_read_mix
        bps = rates.read_rate(mix, job.id, self.seed) if mix else self.params.gpu_read_bw
        e = rates.epochs(job.runtime_ideal, job.gpus, size, bps)
        cap = self.params.max_epochs
        if cap is not None and e > cap:
            self.epochs_capped += 1
            return cap
        return e

    # -- node facts, as the extender would read them from the agents' annotations ---------

    def facts(self, node: Node) -> NodeFacts:
        if node.facts is None:
            held: dict[str, Holding] = {}
            if self.policy in fluid.POLICIES:
                # Fluid's labels: the datasets whose cache workers run here (name only, no digest)
                held = {name: Holding(None, None, True, False) for name in node.labels}
            stripes: dict[str, StripeHolding] = {}
            if self.policy not in BASELINES:
                for (name, version), e in node.cache.items():
                    group = self.stripes.get((name, version)) if e.stripe else None
                    if group is not None:  # a share: the inventory's stripes section, as the agent writes it
                        shown = stripes.get(name)
                        if shown is None or version > int(shown.digest, 16):
                            names = self._member_names(group.members)
                            size, on_disk = int(self.datasets[name].size), int(e.size * group.fill.get(node.index, 0.0))
                            stripes[name] = StripeHolding(f"{version:032x}", size, on_disk, len(names), names)
                        continue
                    newest = held.get(name)
                    if newest is None or version > int(newest.digest or "0", 16):
                        held[name] = Holding(f"{version:032x}", e.size, e.ready, e.users > 0)
            node.facts = NodeFacts(
                name=node.name,
                inventory=Inventory(self.params.cache_bytes, self._free_bytes(node), held, stripes=stripes),
                topology=node.type.topology,
                topology_id=node.type.id,
                classes=node.type.classes,
                allocatable_gpus=len(node.type.topology.gpus),
                published_free=frozenset(node.free),
                gpu_facts_known=True,
            )
        return node.facts

    def _member_names(self, members: tuple[int, ...]) -> tuple[str, ...]:
        """A group's node names, kept per member list: every member's facts list the whole
        group, and groups of hundreds of members are rebuilt often."""
        names = self.names_memo.get(members)
        if names is None:
            names = self.names_memo[members] = tuple(self.nodes[m].name for m in members if m >= 0)
        return names

    def version_of(self, job: Job, start: float) -> int:
        """The version a job's pods read: the one current at ``start``, as the agent resolves
        a version when the pod's task asks; a pod that starts before its copy is whole
        (``ours+stripe+early``) reads the Dataset's digest at admission, which the webhook
        writes into the pod (``dsctl stripe wait NAME DIGEST``), so at the job's arrival."""
        d = self.datasets[job.dataset]
        return d.version_at(job.arrival if self.policy == "ours+stripe+early" else start)

    def touch(self, node: Node) -> None:
        node.facts = None

    def _free_bytes(self, node: Node) -> int:
        if self.policy in fluid.POLICIES:
            return self.params.cache_bytes - self.fluid.committed.get(node.index, 0)
        return self.params.cache_bytes - node.used_bytes

    # -- the node caches' cluster-wide view -----------------------------------------------

    def copies_elsewhere(self, node: Node, key: tuple[str, int]) -> int:
        """How many other nodes hold this dataset version ready (what the controller reads
        from the node inventories)."""
        holders = self.ready_copies.get(key, ())
        return len(holders) - (1 if node.index in holders else 0)

    def _forget(self, node: Node, key: tuple[str, int]) -> None:
        """Drop a cached version (or a stripe share) from a node (evicted or replaced)."""
        entry = node.cache.pop(key, None)
        self.window_read.pop((node.index, key), None)
        if entry is not None and (group := self.stripes.get(key)) is not None:
            group.holding.discard(node.index)  # its share, or the whole copy a member held
        holders = self.ready_copies.get(key)
        if holders is not None:
            holders.discard(node.index)
            if not holders:
                del self.ready_copies[key]

    # -- events -------------------------------------------------------------------------

    def push(self, t: float, kind: str, ident: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, ident))

    # -- what the mixed-in parts provide each other ----------------------------------------

    def _make_room(self, node: Node, size: int) -> bool:
        raise NotImplementedError

    def _start(self, job: Job, workers: list[Worker]) -> None:
        raise NotImplementedError

    def _request_data(self, job: Job, worker: Worker, index: int) -> None:
        raise NotImplementedError

    def _release_workers(self, out: Outcome) -> None:
        raise NotImplementedError

    def _fetch_version(
        self, node: Node, key: tuple[str, int], size: int, *, cached: bool, waiter: tuple[Job, int] | None
    ) -> None:
        raise NotImplementedError


__all__ = ["STORE_CAUSES", "SimState"]
