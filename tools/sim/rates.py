"""The rates a simulated read runs at, each a workload parameter with its default's source.

Who calls it: :mod:`tools.sim.cluster` (``ClusterParams`` takes its defaults from here),
:mod:`tools.sim.workload_file` (the keys of a workload file), :mod:`tools.sim.report`
(every run's JSON carries :func:`table`: the values used and where each default comes
from) and ``docs/simulator.md``. One rule per fact: a default is written here once.

Decision: a default is a figure someone published (a vendor's guide, a paper, the
project's own benchmark), not a measurement of ours on a real cluster; the simulator's
page says which two decide the outcome and sweeps them (``tools/sim/sensitivity.py``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from dsagent.cache.settings import Settings

MB = 1e6
GB = 1e9


@dataclass(frozen=True)
class Rate:
    key: str  # the workload file's key
    value: float
    unit: str
    source: str


# One node reading an object store: AWS's S3 performance guidelines size one request
# stream at 85-90 MB/s and scale by parallel connections; 16 connections, what a FUSE
# client or a data loader typically opens, give about 1.4 GB/s.
STORE_PER_NODE = Rate(
    "store_read_bytes_per_s_per_node",
    1.4 * GB,
    "B/s",
    "AWS, Best practices design patterns: optimizing Amazon S3 performance "
    "(https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html): "
    "85-90 MB/s per request stream; 16 streams",
)
# Our agent's fetch: bundles downloaded, unpacked and every file verified, each bundle on one
# of the agent's fetch workers (dsagent.cache.settings: fetch_workers threads a dataset; the C
# unpack loop and zstd run without the GIL, so each worker takes a core of the node's). What
# one core unpacks: dsctl unpack of one bundle of 10,000 ImageNet-like files (110 KB median,
# incompressible), 1,289 MB in 1.14 CPU-seconds with the interpreter's start-up counted.
# GPU nodes have tens of cores (a DGX A100 has 128); the agent asks for few and has no CPU
# limit, so its fetch workers are taken to find a core each. The rate is the node's for
# all its fetches together; the store, the peers' serving and the NIC cap each transfer.
UNPACK_PER_CORE = 1.13 * GB
FETCH_WORKERS = int(Settings.model_fields["fetch_workers"].default)
UNPACK = Rate(
    "node_fetch_bytes_per_s",
    UNPACK_PER_CORE * FETCH_WORKERS,
    "B/s",
    f"tools/bench/bundle.py --files 10000 --median-kb 110 (dsctl unpack: 1.13 GB per CPU-second) "
    f"x the agent's {FETCH_WORKERS} fetch workers (dsagent.cache.settings)",
)
# What one cache node serves to remote readers, all its uploads together: an NVMe drive's
# sequential read (Samsung PM1733 data sheet: 7 GB/s; a worker serving several readers
# over TCP reaches about half) -- the remote-cache read rate of Fluid's workers, JuiceFS's
# group members and our peers alike.
REMOTE_CACHE = Rate(
    "node_serve_bytes_per_s",
    3 * GB,
    "B/s",
    "Samsung PM1733 NVMe data sheet (7 GB/s sequential read), about half of it served over TCP to several readers",
)
# Reading through a FUSE mount (Fluid's Alluxio/JuiceFS FUSE, JuiceFS's client): the share
# of the underlying rate a FUSE read keeps for large sequential reads.
FUSE = Rate(
    "fuse_throughput_factor",
    0.75,
    "x",
    "Vangoor et al., To FUSE or Not to FUSE, USENIX FAST 2017 "
    "(https://www.usenix.org/system/files/conference/fast17/fast17-vangoor.pdf): "
    "sequential reads of large files through an optimised FUSE lose up to about a quarter",
)
# A node's local NVMe read (ours: the unpacked files; the baselines: their local blocks).
LOCAL_DISK = Rate(
    "local_read_bytes_per_s",
    6 * GB,
    "B/s",
    "DGX A100 User Guide (4 x 3.84 TB U.2 NVMe in RAID 0 for /raid); PM1733 data sheet, 7 GB/s per drive",
)
# How fast one GPU consumes its dataset: ResNet-50 on an A100 trains at about 2,700
# images/s with DALI (NVIDIA DeepLearningExamples, ResNet50 v1.5 results) and an ImageNet
# JPEG averages 110 KB (1.28 M images, 140 GB): about 300 MB/s per GPU.
GPU_READ = Rate(
    "gpu_read_bytes_per_s",
    300 * MB,
    "B/s",
    "NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 (about 2,700 img/s per A100, DALI, AMP) "
    "x 110 KB per ImageNet JPEG",
)


@dataclass(frozen=True)
class ReadClass:
    """One kind of training job in the mix: its share of the jobs and what one GPU reads."""

    name: str
    share: float
    bytes_per_s: float
    source: str


# A language model reads far less per GPU than an image model: Llama 2 7B was trained on
# 2.0 T tokens in 184,320 A100 GPU-hours (Touvron et al. 2023, Tables 1 and 2), about 3,000
# tokens/s per GPU, each token id 2 bytes (uint16, the pre-tokenised form Megatron-LM reads).
LANGUAGE_READ = ReadClass(
    "language",
    0.5,
    6_000.0,
    "Touvron et al., Llama 2 (2023), Tables 1-2: 2.0 T tokens in 184,320 A100 GPU-hours for 7B, "
    "about 3,000 tokens/s per GPU, x 2 bytes per token id (uint16, pre-tokenised)",
)
VISION_READ = ReadClass("vision", 0.5, GPU_READ.value, GPU_READ.source)
#: the default mix: half the jobs of each kind (a modelling choice: the Philly trace the run
#: times come from does not say what its jobs trained; ``tools/sim/sensitivity.py`` sweeps it)
READ_MIX = (VISION_READ, LANGUAGE_READ)


def read_rate(mix: Sequence[tuple[str, float, float]], job_id: int, seed: int) -> float:
    """What one GPU of job ``job_id`` reads, drawn from ``mix`` ((name, share, bytes/s), the
    shares summing to at most 1, the last taking the rest) per job and seed, independent of
    the policy run."""
    draw = random.Random(f"read-rate/{seed}/{job_id}").random()
    total = 0.0
    for _, share, bps in mix:
        total += share
        if draw < total:
            return bps
    return mix[-1][2]


# NIC bandwidth per node type for data (storage and peer traffic), bytes/s.
NIC: dict[str, tuple[float, str]] = {
    "dgx-a100": (50 * GB, "DGX A100 User Guide: 2 x 200 Gb/s ConnectX-6 storage/in-band ports"),
    "v100-2nic": (25 * GB, "the dump's 2 NICs, taken as 100 Gb/s EDR each (OneFlow HugeCTR test machine)"),
    "dgx1-v100": (50 * GB, "DGX-1 data sheet: 4 x 100 Gb/s EDR InfiniBand"),
    "h100-11nic": (100 * GB, "DGX H100 User Guide: 2 x 400 Gb/s ConnectX-7 storage ports"),
    "a100-pcie-2gpu": (25 * GB, "Princeton Della: HDR 200 Gb/s per node"),
}
NIC_DEFAULT = 25 * GB  # a node type not in the table: one 200 Gb/s port

RATES = (STORE_PER_NODE, UNPACK, REMOTE_CACHE, FUSE, LOCAL_DISK, GPU_READ)


def epochs(runtime_s: float, gpus: int, size: float, gpu_read_bps: float) -> float:
    """Passes over its dataset a job makes in its run time: every GPU reading at the
    per-GPU rate for the whole run (data-parallel ranks read disjoint shares of an epoch).
    Below 1 a job reads only part of its dataset."""
    return runtime_s * gpus * gpu_read_bps / size if size > 0 else 0.0


def table(values: dict[str, float]) -> list[dict[str, object]]:
    """Every rate a run used: key, value, unit, whether it is the default, and the source."""
    out: list[dict[str, object]] = []
    for r in RATES:
        v = values.get(r.key, r.value)
        out.append({"key": r.key, "value": v, "unit": r.unit, "default": v == r.value, "source": r.source})
    return out


__all__ = [
    "GPU_READ", "LANGUAGE_READ", "LOCAL_DISK", "NIC", "NIC_DEFAULT", "RATES", "READ_MIX", "VISION_READ", "Rate",
    "ReadClass", "epochs", "read_rate", "table",
]  # fmt: skip
