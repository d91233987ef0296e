"""A simulated workload in one JSON file: the schema, its validation and its defaults.

Who calls it: ``tools/sim/run.py --workload FILE.json`` and ``tools/sim/sweep.py``. It owns
the file format (:class:`WorkloadFile`, pydantic, unknown keys refused) and its mapping
onto the engine's :class:`~tools.sim.engine.ClusterParams` and the generator's
:class:`~tools.sim.workload.WorkloadParams`; their defaults stay where they are (one rule
per fact), so a key left out means the documented default of those dataclasses.

Example (``tools/sim/workloads/default.json`` is the preset docs/simulation.md measures)::

    {"seed": 1,
     "nodes": [{"type": "dgx-a100", "count": 250}, {"type": "v100-2nic", "count": 150}],
     "cache_bytes_per_node": 4000000000000,
     "storage_bytes_per_s": 20000000000,
     "datasets": {"count": 300, "size_median_bytes": 120000000000, "size_sigma": 1.0,
                  "zipf_s": 1.0, "new_version_mean_days": 3},
     "jobs": {"count": 5000, "load": 0.85,
              "workers": {"1": 0.75, "2": 0.12, "4": 0.09, "8": 0.04},
              "gpus_per_worker": {"1": 0.45, "2": 0.2, "4": 0.2, "8": 0.15},
              "deadline_alpha": [1.5, 3, 6]}}

Decisions: probabilities must sum to 1 (within 1e-6), nothing is normalised silently; node
types are the names of :mod:`tools.sim.nodetypes` (``run.py --list-node-types``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tools.sim import nodetypes, rates
from tools.sim.cluster import ClusterParams
from tools.sim.workload import WorkloadParams

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
DAY = 86_400.0
MAX_NODES = 100_000
MAX_JOBS = 1_000_000


class WorkloadError(ValueError):
    """A workload file that cannot be used; ``str()`` is one line."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _table(value: dict[str, float], what: str) -> dict[str, float]:
    if not value:
        raise ValueError(f"{what} needs at least one value")
    for key, p in value.items():
        if not key.isdigit() or not 1 <= int(key) <= 1024:
            raise ValueError(f"{what} keys are whole numbers 1..1024, not {key!r}")
        if not 0 <= p <= 1:
            raise ValueError(f"{what} probabilities are in [0, 1], not {p}")
    if abs(sum(value.values()) - 1) > 1e-6:
        raise ValueError(f"{what} probabilities sum to {sum(value.values()):.6g}, not 1")
    return value


class NodeGroup(Strict):
    type: str = Field(description="a node type name (run.py --list-node-types)")
    count: int = Field(ge=1, le=MAX_NODES)

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in nodetypes.NODE_TYPES:
            raise ValueError(f"unknown node type {v!r}; known: {', '.join(nodetypes.NODE_TYPES)}")
        return v


class Datasets(Strict):
    count: int = Field(ge=1, le=100_000, description="datasets, popularity Zipf(zipf_s) by rank")
    size_median_bytes: Positive = Field(description="median of the log-normal dataset size")
    size_sigma: NonNegative = Field(description="sigma of the log-normal size (0: all the median)")
    zipf_s: NonNegative = Field(description="Zipf exponent of dataset popularity (0: uniform)")
    new_version_mean_days: Positive = Field(description="mean days between a dataset's new versions (Poisson)")
    size_min_bytes: Positive = Field(WorkloadParams.dataset_bytes[0], description="sizes are clipped to this")
    size_max_bytes: Positive = Field(WorkloadParams.dataset_bytes[1], description="sizes are clipped to this")

    @model_validator(mode="after")
    def _bounds(self) -> Datasets:
        if self.size_min_bytes > self.size_max_bytes:
            raise ValueError("size_min_bytes is above size_max_bytes")
        return self


class Jobs(Strict):
    count: int = Field(ge=1, le=MAX_JOBS)
    load: float = Field(gt=0, le=2, description="offered GPU-seconds / the cluster's GPU-seconds")
    workers: dict[str, float] = Field(description='pods per job: {"value": probability}')
    gpus_per_worker: dict[str, float] = Field(description='GPUs per pod: {"value": probability}')
    gpus_per_worker_multi: dict[str, float] | None = Field(
        None, description="GPUs per pod of multi-worker jobs (default: gpus_per_worker)"
    )
    deadline_alpha: list[Positive] = Field(
        min_length=1, max_length=64, description="deadline = arrival + alpha x ideal run time; alpha drawn from this"
    )
    deadline_alpha_share: list[NonNegative] | None = Field(
        None, description="probability of each deadline_alpha (default: equal)"
    )
    deadline_rule: Literal["eq6", "asked"] = Field(
        "eq6",
        description="eq6: deadline = alpha x run time on one GPU (design eq. 6); "
        "asked: alpha x run time on the GPUs asked for",
    )
    min_runtime_s: Positive = WorkloadParams.min_runtime_s
    max_runtime_s: Positive = WorkloadParams.max_runtime_s
    gradient_median_bytes: Positive = WorkloadParams.gradient_median_bytes
    gradient_sigma: NonNegative = WorkloadParams.gradient_sigma
    step_s: tuple[Positive, Positive] = WorkloadParams.step_s
    epochs: Positive | None = Field(
        None,
        description="every job's passes over its dataset; left out: from its run time, GPUs, dataset size "
        "and gpu_read_bytes_per_s",
    )
    max_epochs: Positive | None = Field(
        None, description="a cap on derived epochs (none by default); the run reports the jobs it lowered"
    )

    @field_validator("workers", "gpus_per_worker", "gpus_per_worker_multi")
    @classmethod
    def _tables(cls, v: dict[str, float] | None, info: Any) -> dict[str, float] | None:
        return None if v is None else _table(v, info.field_name)

    @model_validator(mode="after")
    def _consistent(self) -> Jobs:
        if self.deadline_alpha_share is not None:
            if len(self.deadline_alpha_share) != len(self.deadline_alpha):
                raise ValueError("deadline_alpha_share needs one probability per deadline_alpha")
            if abs(sum(self.deadline_alpha_share) - 1) > 1e-6:
                raise ValueError("deadline_alpha_share does not sum to 1")
        if self.min_runtime_s > self.max_runtime_s or self.step_s[0] > self.step_s[1]:
            raise ValueError("a minimum is above its maximum (min/max_runtime_s or step_s)")
        return self


class ReadMixEntry(Strict):
    """One kind of job in ``gpu_read_mix``."""

    name: str = Field(min_length=1, max_length=40)
    share: Annotated[float, Field(gt=0, le=1)]
    bytes_per_s: Annotated[float, Field(gt=0)]


class WorkloadFile(Strict):
    """Every parameter of one simulated cluster and workload."""

    seed: int = Field(ge=0, le=2**31 - 1)
    nodes: list[NodeGroup] = Field(min_length=1, max_length=64)
    cache_bytes_per_node: int = Field(ge=0, description="NVMe cache per node")
    storage_bytes_per_s: Positive = Field(description="shared storage bandwidth, all nodes together")
    node_fetch_bytes_per_s: Positive = Field(
        ClusterParams.node_fetch_bw, description="ours: one node's fetch rate (the agent's measured unpack rate)"
    )
    peers: bool = Field(True, description="ours reads a version another node holds ready from it (P2P)")
    node_serve_bytes_per_s: Positive = Field(
        ClusterParams.node_serve_bw,
        description="remote-cache read: what one node serves to other nodes, all its uploads together",
    )
    store_read_bytes_per_s_per_node: Positive = Field(
        ClusterParams.store_node_bw, description="one node's object-store read rate"
    )
    fuse_throughput_factor: Annotated[float, Field(gt=0, le=1)] = Field(
        ClusterParams.fuse_factor, description="share of the rate a read through FUSE keeps"
    )
    local_read_bytes_per_s: Positive = Field(ClusterParams.disk_bw, description="one node's local NVMe read rate")
    gpu_read_bytes_per_s: Positive | None = Field(
        None,
        description="what every GPU reads while training (derives epochs); left out: each job draws its rate "
        "from gpu_read_mix",
    )
    gpu_read_mix: list[ReadMixEntry] | None = Field(
        None,
        description="kinds of job, each with its share and per-GPU read rate, drawn per job; default: the"
        " vision/language mix of tools/sim/rates.py, or every job at gpu_read_bytes_per_s where the file sets it",
    )
    nic_bytes_per_s: dict[str, Positive] = Field(
        default_factory=dict, description="per node type, its data NIC bandwidth (default: tools/sim/rates.py NIC)"
    )
    fluid_quota_bytes: int = Field(
        ClusterParams.fluid_quota_bytes, ge=0, description="Fluid: quota per cache worker (0: size / replicas)"
    )
    juicefs_group_nodes: int = Field(
        ClusterParams.juicefs_group_nodes, ge=0, description="JuiceFS: cache group members (0: every node)"
    )
    cross_subnet_factor: Annotated[float, Field(gt=0, le=1)] = ClusterParams.cross_subnet_factor
    queue_scan: int = Field(ClusterParams.queue_scan, ge=1, le=10_000)
    datasets: Datasets
    jobs: Jobs

    @model_validator(mode="after")
    def _size(self) -> WorkloadFile:
        if sum(g.count for g in self.nodes) > MAX_NODES:
            raise ValueError(f"more than {MAX_NODES} nodes")
        if self.gpu_read_mix is not None and not 0.999 <= sum(m.share for m in self.gpu_read_mix) <= 1.001:
            raise ValueError("gpu_read_mix: the shares must add up to 1")
        unknown = [t for t in self.nic_bytes_per_s if t not in nodetypes.NODE_TYPES]
        if unknown:
            raise ValueError(f"nic_bytes_per_s: unknown node types {unknown}")
        return self

    def read_mix(self) -> tuple[tuple[str, float, float], ...]:
        """The per-GPU read rates jobs draw from: the file's ``gpu_read_mix``; none (every job
        at ``gpu_read_bytes_per_s``) where the file sets that rate alone; else the default mix."""
        if self.gpu_read_mix is not None:
            return tuple((m.name, m.share, m.bytes_per_s) for m in self.gpu_read_mix)
        if self.gpu_read_bytes_per_s is not None:
            return ()
        return tuple((c.name, c.share, c.bytes_per_s) for c in rates.READ_MIX)

    def cluster(self) -> ClusterParams:
        counts = tuple((nodetypes.fixture(g.type), g.count) for g in self.nodes)
        return ClusterParams(
            nodes=sum(g.count for g in self.nodes),
            node_counts=counts,
            cache_bytes=self.cache_bytes_per_node,
            storage_bw=self.storage_bytes_per_s,
            node_fetch_bw=self.node_fetch_bytes_per_s,
            node_serve_bw=self.node_serve_bytes_per_s,
            cross_subnet_factor=self.cross_subnet_factor,
            queue_scan=self.queue_scan,
            peers=self.peers,
            epochs=self.jobs.epochs,
            max_epochs=self.jobs.max_epochs,
            store_node_bw=self.store_read_bytes_per_s_per_node,
            fuse_factor=self.fuse_throughput_factor,
            disk_bw=self.local_read_bytes_per_s,
            gpu_read_bw=self.gpu_read_bytes_per_s or ClusterParams.gpu_read_bw,
            gpu_read_mix=self.read_mix(),
            nic_bw=tuple(sorted(self.nic_bytes_per_s.items())),
            fluid_quota_bytes=self.fluid_quota_bytes,
            juicefs_group_nodes=self.juicefs_group_nodes,
        )

    def workload(self) -> WorkloadParams:
        j, d = self.jobs, self.datasets

        def table(v: dict[str, float]) -> tuple[tuple[int, float], ...]:
            return tuple((int(k), p) for k, p in v.items() if p > 0)

        shares = j.deadline_alpha_share or [1 / len(j.deadline_alpha)] * len(j.deadline_alpha)
        return WorkloadParams(
            jobs=j.count,
            load=j.load,
            min_runtime_s=j.min_runtime_s,
            max_runtime_s=j.max_runtime_s,
            workers=table(j.workers),
            gpus_single=table(j.gpus_per_worker),
            gpus_multi=table(j.gpus_per_worker_multi or j.gpus_per_worker),
            gradient_median_bytes=j.gradient_median_bytes,
            gradient_sigma=j.gradient_sigma,
            step_s=j.step_s,
            datasets=d.count,
            zipf_s=d.zipf_s,
            dataset_median_bytes=d.size_median_bytes,
            dataset_sigma=d.size_sigma,
            dataset_bytes=(d.size_min_bytes, d.size_max_bytes),
            version_interval_s=d.new_version_mean_days * DAY,
            priorities=tuple(zip(j.deadline_alpha, shares)),
            deadline_rule=j.deadline_rule,
        )

    def with_cache(self, cache_bytes_per_node: int) -> WorkloadFile:
        return self.model_copy(update={"cache_bytes_per_node": int(cache_bytes_per_node)})


def one_line(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def load(path: Path) -> WorkloadFile:
    """Read and validate a workload file; :class:`WorkloadError` (one line) when unusable."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > 1_000_000:
        raise WorkloadError(f"{path}: larger than 1 MB")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{path}: not JSON: {e}") from None
    try:
        return WorkloadFile.model_validate(data)
    except ValidationError as e:
        raise WorkloadError(f"{path}: {one_line(e)}") from None


def total_gpus(cluster: ClusterParams) -> int:
    from tools.sim.cluster import build_nodes

    return sum(len(n.type.topology.gpus) for n in build_nodes(cluster, 0))


def datasets_total_bytes(wf: WorkloadFile) -> int:
    """The generated datasets' total size (one copy of each, first version) for the seed."""
    from tools.sim.workload import make_jobs

    _, datasets = make_jobs(wf.workload(), total_gpus(wf.cluster()), wf.seed)
    return sum(d.size for d in datasets)


__all__ = [
    "Datasets",
    "Jobs",
    "NodeGroup",
    "WorkloadError",
    "WorkloadFile",
    "datasets_total_bytes",
    "load",
    "one_line",
    "total_gpus",
]
