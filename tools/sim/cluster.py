"""The simulated cluster's parameters and state records: nodes, caches, transfers, jobs' outcomes.

Who calls it: every module of the simulator's engine (:mod:`tools.sim.engine`,
:mod:`tools.sim.placement`, :mod:`tools.sim.flows`, :mod:`tools.sim.reads`) and
:mod:`tools.sim.workload_file` (``ClusterParams``). It owns the records and how a cluster
is built from the topology fixtures; no behaviour beyond that.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from gpu_topology import Topology, roce_classes
from gpu_topology.dumps import load_dump
from scheduling.nodeinfo import NodeFacts, RoceClassInfo
from tools.sim import rates
from tools.sim.workload import Job

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "tests" / "fixtures" / "topology"
MEASURED_FETCH_BPS = rates.UNPACK.value
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
    node_fetch_bw: float = MEASURED_FETCH_BPS  # ours: the agent's unpack rate per node
    cross_subnet_factor: float = 0.5  # ring bandwidth when a job's workers sit in different subnets
    queue_scan: int = 40  # waiting jobs tried per scheduling round
    prepare_next: bool = False  # opt-in: ours prepares waiting jobs' data (docs/design.md#next-job-preparation)
    plan_sizes: str = "pow2"  # GPU counts the time model may give a job: pow2 (1, 2, 4, ... up to the
    # count asked for, and that count) or "asked" (only the count asked for)
    node_counts: tuple[tuple[str, int], ...] = ()  # exact (fixture, count) list; when set it replaces
    # ``nodes`` and ``node_types``' shares (a workload file's ``nodes`` key)
    peers: bool = True  # ours: a version another node holds ready comes from that peer, not storage
    epochs: float | None = None  # every job's passes over its dataset; None: from its run time (rates.epochs)
    max_epochs: float | None = None  # a cap on derived epochs; the run reports the jobs it changed
    node_serve_bw: float = rates.REMOTE_CACHE.value  # what one node serves to remote readers, all together
    store_node_bw: float = rates.STORE_PER_NODE.value  # one node's object-store read
    fuse_factor: float = rates.FUSE.value  # share of the rate a FUSE read keeps
    disk_bw: float = rates.LOCAL_DISK.value  # one node's local NVMe read
    gpu_read_bw: float = rates.GPU_READ.value  # what one GPU reads while training
    # (name, share, bytes/s) per kind of job, drawn per job (rates.read_rate); empty: every
    # job reads at gpu_read_bw
    gpu_read_mix: tuple[tuple[str, float, float], ...] = ()
    nic_bw: tuple[tuple[str, float], ...] = ()  # (node type name, bytes/s) overriding rates.NIC
    fluid_quota_bytes: int = 0  # per cache worker; 0: the dataset's size / replicas, at most the node's cache
    juicefs_group_nodes: int = 0  # members of the JuiceFS cache group (the first N nodes); 0: every node

    def rate_values(self) -> dict[str, float]:
        return {
            rates.STORE_PER_NODE.key: self.store_node_bw,
            rates.UNPACK.key: self.node_fetch_bw,
            rates.REMOTE_CACHE.key: self.node_serve_bw,
            rates.FUSE.key: self.fuse_factor,
            rates.LOCAL_DISK.key: self.disk_bw,
            rates.GPU_READ.key: self.gpu_read_bw,
        }


@dataclass
class NodeType:
    name: str
    topology: Topology
    id: int
    classes: tuple[RoceClassInfo, ...]
    class_of: dict[int, str]
    nic_bw: float = rates.NIC_DEFAULT


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
    stripe: bool = False  # this node's share of a version striped over a group (tools/sim/stripe.py)
    # of the version, the part on its disk: a copy whose store reads wait for readers
    # (``ours+stripe+early``, the agent's storeOnDemand) holds what its jobs have read
    part: float = 1.0
    # of a copy holding part of the version while it fetches more of it (``_top_up``): the
    # part on its disk already, which its peers read from it as the agents' swarm does
    landed: float = 0.0

    @property
    def in_use(self) -> bool:
        return self.users > 0 or self.prepared or self.replica

    @property
    def on_disk(self) -> int:
        """The bytes it takes: a share's part on disk (its bundles take their room as they
        arrive), a copy's whole size (reserved from its fetch's start)."""
        return int(self.size * self.part) if self.stripe else self.size


@dataclass
class Node:
    index: int
    name: str
    type: NodeType
    free: set[int]
    cache: dict[tuple[str, int], CacheEntry] = field(default_factory=dict)
    labels: set[str] = field(default_factory=set)  # Fluid: datasets whose cache workers run here
    facts: NodeFacts | None = None

    @property
    def used_bytes(self) -> int:
        return sum(e.on_disk for e in self.cache.values())


@dataclass
class Fetch:
    """Bytes moving to one node: from shared storage, from other nodes' caches (``peer``)
    or from its own disk (``local``).

    ``stream``: a training read, while the GPUs work: the job's end waits for it, its
    first step does not, and it goes no faster than the job's steps take its bytes
    (``pace``). Otherwise a fill the first step waits for (``waiters``). ``unpack``: ours'
    fetch, limited by the node's unpack rate; ``fuse``: read through a FUSE mount (the
    rate times ``fuse_factor``)."""

    node: Node
    key: tuple[str, int]
    remaining: float
    cached: bool
    waiters: list[tuple[Job, int]] = field(default_factory=list)
    source: str = "storage"  # "storage" | "peer" | "local"
    stream: bool = False
    after: Fetch | None = None  # bytes this other fetch is still bringing in: no faster than it
    sources: tuple[int, ...] = ()  # the nodes serving a peer fetch; empty: spread over many
    unpack: bool = False  # ours' fetch: limited by the node's unpack rate, shared among its fetches
    fuse: bool = False
    on_done: str = ""  # what finishing it means: "" (ours' copy), "stripe"
    part: bool = False  # one part of a copy filled in parts: its end does not make the copy ready
    total: float = 0.0  # the bytes it moves in all (``remaining`` counts down from it)
    # a training read's most (bytes/s): its bytes over the job's compute left when it
    # started, as a pod's loader reads ahead of its steps only by what it buffers
    pace: float = math.inf
    # a training read's bytes of stripe slots no node held when it started (holes), by the
    # slot's member: (its bytes in ``total``, the bytes of the slot one epoch reads)
    holes: dict[int, tuple[float, float]] = field(default_factory=dict)
    # kept by tools.sim.flows: the fair share before ``after`` is applied, the rate, whether open
    base: float = field(default=0.0, repr=False, compare=False)
    rate: float = field(default=0.0, repr=False, compare=False)
    open: bool = field(default=True, repr=False, compare=False)


Holes = dict[int, tuple[float, float]]  # :attr:`Fetch.holes`


@dataclass
class Worker:
    node: Node
    gpus: tuple[int, ...]
    classes: frozenset[str]
    hit: bool = False
    reads: list[tuple[str, float, tuple[int, ...], bool, Fetch | None, bool, Holes, float]] = field(
        default_factory=list
    )
    # the training reads to start at the first step: (source, bytes, serving nodes, fuse,
    # the fetch they follow, whether the store's bytes are kept in a cache, of them the
    # bytes of lost stripe members (holes, :attr:`Fetch.holes`) and other bytes no cache keeps)


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
    streams: int = 0  # training reads still running
    compute_end: float = math.nan  # when the GPUs' work is done; ``end`` waits for the streams too
    remaining: float = 1.0  # part of the work left when the (re)start's data is ready
    delay: float = 0.0  # checkpoint + restart of a move, before the first step on the new GPUs
    migrations: int = 0
    migratable: bool = False
    epochs: float = 1.0


def load_node_types(params: ClusterParams) -> list[tuple[NodeType, float]]:
    """The node types with their shares (``node_counts``: their counts)."""
    from tools.sim.nodetypes import NODE_TYPES

    name_of = {file: name for name, file in NODE_TYPES.items()}
    nic = {**{k: v for k, (v, _) in rates.NIC.items()}, **dict(params.nic_bw)}
    out = []
    listed = params.node_counts or params.node_types
    for i, (file, share) in enumerate(listed):
        topo = load_dump(TOPOLOGIES / file)
        classes = tuple(RoceClassInfo(c.name, frozenset(c.gpus)) for c in roce_classes(topo))
        class_of = {g: c.name for c in classes for g in c.gpus}
        bw = nic.get(name_of.get(file, ""), rates.NIC_DEFAULT)
        out.append((NodeType(file.split("-nvidia")[0], topo, i, classes, class_of, bw), float(share)))
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


__all__ = [
    "EPOCH",
    "MEASURED_FETCH_BPS",
    "CacheEntry",
    "ClusterParams",
    "Fetch",
    "Node",
    "NodeType",
    "Outcome",
    "Worker",
    "build_nodes",
    "load_node_types",
]
