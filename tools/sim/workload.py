"""The simulated workload: jobs drawn from real run times and documented parameters.

Who calls it: :mod:`tools.sim.engine` (through ``run.py``) and the simulator's tests. It
owns every workload parameter and its default (:class:`WorkloadParams`), and turns a seed
into the same list of :class:`Job` every time (stdlib ``random.Random``, no global state).

- **Run times**: drawn from ``data/philly_runtime.csv``, 83,154 real job run times from
  Microsoft's Philly clusters (see ``data/philly_runtime.csv.src``), clipped to
  ``[min_runtime_s, max_runtime_s]``. A drawn run time is the job's run time on the GPUs it
  asks for, placed as well as the hardware allows (one NVLinked node, or a clean network
  ring for multi-worker jobs); the time model then stretches it on worse placements.
- **Shape**: workers per job and GPUs per worker from the tables below.
- **Model**: gradient bytes log-normal, single-GPU step time uniform; the one-GPU step
  count follows from the run time by inverting eq. (1)-(3) of the time model.
- **Data**: ``datasets`` datasets with Zipf(``zipf_s``) popularity and log-normal sizes;
  each dataset gets a new version (a new digest) at Poisson times, mean
  ``version_interval_s``.
- **Arrivals**: Poisson, at a rate that offers ``load`` x the cluster's GPUs in GPU-seconds.
- **Deadlines**: eq. (6)-(7), ``t_dl = t_arr + alpha x t_single`` with ``alpha`` per priority
  (``priorities_single``) and ``t_single`` the job's run time on one GPU
  (:func:`scheduling.timemodel.expected_run_time`); ``deadline_rule="asked"`` keeps the
  earlier rule, ``alpha x`` the run time on the GPUs asked for (``priorities``).
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from scheduling.timemodel import DEFAULT_BANDWIDTHS, JobProfile, expected_run_time, t_run

RUNTIME_CSV = Path(__file__).resolve().parent / "data" / "philly_runtime.csv"
GB = 1e9


@dataclass(frozen=True)
class WorkloadParams:
    jobs: int = 5000
    load: float = 0.85  # offered GPU-seconds / cluster GPU-seconds
    min_runtime_s: float = 60.0
    max_runtime_s: float = 3 * 86_400.0
    workers: tuple[tuple[int, float], ...] = ((1, 0.75), (2, 0.12), (4, 0.09), (8, 0.04))
    gpus_single: tuple[tuple[int, float], ...] = ((1, 0.45), (2, 0.20), (4, 0.20), (8, 0.15))
    gpus_multi: tuple[tuple[int, float], ...] = ((2, 0.30), (4, 0.40), (8, 0.30))
    gradient_median_bytes: float = 0.4 * GB  # ~100M fp32 parameters
    gradient_sigma: float = 1.0
    step_s: tuple[float, float] = (0.1, 0.6)
    datasets: int = 300
    zipf_s: float = 1.0
    dataset_median_bytes: float = 120 * GB
    dataset_sigma: float = 1.0
    dataset_bytes: tuple[float, float] = (1 * GB, 2000 * GB)
    version_interval_s: float = 3 * 86_400.0
    priorities: tuple[tuple[float, float], ...] = ((1.5, 0.2), (3.0, 0.5), (6.0, 0.3))  # (alpha, share)
    deadline_rule: str = "eq6"  # eq6: alpha x t_single (priorities_single); asked: alpha x t_ideal
    priorities_single: tuple[tuple[float, float], ...] = ((1.0, 0.2), (2.0, 0.5), (4.0, 0.3))


@dataclass(frozen=True)
class Dataset:
    name: str
    size: int
    versions: tuple[float, ...]  # times at which a new version appears (first: 0)
    drawn: int = 0  # the size drawn before ``dataset_bytes`` clipped it (0: not recorded)

    def version_at(self, t: float) -> int:
        return bisect.bisect_right(self.versions, t) - 1


@dataclass
class Job:
    id: int
    arrival: float
    workers: int
    gpus_per_worker: int
    dataset: str
    runtime_ideal: float  # the drawn Philly run time
    profile: JobProfile  # deadline absolute, in simulated seconds
    alpha: float = 1.0
    extra: dict[str, float] = field(default_factory=dict)
    drawn_runtime: float = 0.0  # the Philly run time before ``min/max_runtime_s`` clipped it

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


def input_changes(p: WorkloadParams, jobs: list[Job], datasets: list[Dataset]) -> list[str]:
    """What the workload's clips changed in the drawn input, one line each (empty: nothing):
    a cap is a workload field, and a run says when it changed the input."""
    lo, hi = p.dataset_bytes
    out = []
    big = [d for d in datasets if d.drawn > hi]
    small = [d for d in datasets if 0 < d.drawn < lo]
    if big:
        out.append(
            f"{len(big)} of {len(datasets)} dataset sizes drawn above size_max_bytes ({hi:.3g}) were set to it "
            f"(largest drawn {max(d.drawn for d in big):.3g} B)"
        )
    if small:
        out.append(
            f"{len(small)} of {len(datasets)} dataset sizes drawn below size_min_bytes ({lo:.3g}) were set to it"
        )
    long = [j for j in jobs if j.drawn_runtime > p.max_runtime_s]
    short = [j for j in jobs if 0 < j.drawn_runtime < p.min_runtime_s]
    if long:
        out.append(
            f"{len(long)} of {len(jobs)} run times drawn above max_runtime_s ({p.max_runtime_s:g} s) were set to it"
        )
    if short:
        out.append(
            f"{len(short)} of {len(jobs)} run times drawn below min_runtime_s ({p.min_runtime_s:g} s) were set to it"
        )
    return out


def load_runtimes(path: Path = RUNTIME_CSV) -> list[float]:
    return list(_read_runtimes(path))


@functools.lru_cache(maxsize=4)
def _read_runtimes(path: Path) -> tuple[float, ...]:
    """The trace's run times, parsed once per process (every policy of a run draws from it)."""
    with path.open(newline="") as f:
        return tuple(float(row["runtime"]) for row in csv.DictReader(f))


def _pick(rng: random.Random, table: tuple[tuple[int, float], ...] | tuple[tuple[float, float], ...]) -> float:
    values = [v for v, _ in table]
    weights = [w for _, w in table]
    return rng.choices(values, weights)[0]


def ideal_bandwidth(workers: int, gpus_per_worker: int) -> float:
    """The bandwidth a job's drawn run time assumes: NVLink 3 x 12 inside one node, the
    network across nodes (one GPU: no communication)."""
    if workers > 1:
        return DEFAULT_BANDWIDTHS.network
    return math.inf if gpus_per_worker <= 1 else 12 * DEFAULT_BANDWIDTHS.nvlink_per_link


def make_datasets(p: WorkloadParams, rng: random.Random, horizon: float) -> list[Dataset]:
    out = []
    lo, hi = p.dataset_bytes
    for i in range(p.datasets):
        drawn = rng.lognormvariate(math.log(p.dataset_median_bytes), p.dataset_sigma)
        size = min(hi, max(lo, drawn))
        versions = [0.0]
        t = rng.expovariate(1 / p.version_interval_s)
        while t < horizon:
            versions.append(t)
            t += rng.expovariate(1 / p.version_interval_s)
        out.append(Dataset(f"ds{i:03d}", int(size), tuple(versions), int(drawn)))
    return out


def make_jobs(
    p: WorkloadParams, total_gpus: int, seed: int, runtimes: list[float] | None = None
) -> tuple[list[Job], list[Dataset]]:
    """The jobs (sorted by arrival) and datasets of one seed."""
    rng = random.Random(seed)
    pool = runtimes if runtimes is not None else load_runtimes()
    shapes = []
    for _ in range(p.jobs):
        workers = int(_pick(rng, p.workers))
        gpw = int(_pick(rng, p.gpus_multi if workers > 1 else p.gpus_single))
        drawn = rng.choice(pool)
        runtime = min(p.max_runtime_s, max(p.min_runtime_s, drawn))
        shapes.append((workers, gpw, runtime, drawn))
    demand = sum(w * g * r for w, g, r, _ in shapes) / len(shapes)  # GPU-seconds per job
    rate = p.load * total_gpus / demand  # jobs per second
    zipf = [1 / (k + 1) ** p.zipf_s for k in range(p.datasets)]
    t = 0.0
    drafts = []
    for workers, gpw, runtime, drawn in shapes:
        t += rng.expovariate(rate)
        drafts.append((t, workers, gpw, runtime, drawn))
    datasets = make_datasets(p, rng, horizon=t + p.max_runtime_s)
    jobs = []
    for i, (arrival, workers, gpw, runtime, drawn) in enumerate(drafts):
        gradient = min(40 * GB, max(1e7, rng.lognormvariate(math.log(p.gradient_median_bytes), p.gradient_sigma)))
        step = rng.uniform(*p.step_s)
        n = workers * gpw
        unit = JobProfile(gradient, step, n)  # one step per GPU: t_run = one step
        per_step = t_run(unit, n, ideal_bandwidth(workers, gpw))
        steps = max(1, round(runtime / per_step) * n)
        ideal = t_run(JobProfile(gradient, step, steps), n, ideal_bandwidth(workers, gpw))
        if p.deadline_rule == "eq6":
            alpha = float(_pick(rng, p.priorities_single))
            expected = expected_run_time(alpha, JobProfile(gradient, step, steps))
        else:
            alpha = float(_pick(rng, p.priorities))
            expected = alpha * ideal
        profile = JobProfile(gradient, step, steps, deadline=arrival + expected, workers=workers)
        dataset = datasets[rng.choices(range(p.datasets), zipf)[0]].name
        jobs.append(Job(i, arrival, workers, gpw, dataset, ideal, profile, alpha, drawn_runtime=drawn))
    return jobs, datasets


__all__ = [
    "Dataset",
    "Job",
    "RUNTIME_CSV",
    "WorkloadParams",
    "ideal_bandwidth",
    "input_changes",
    "load_runtimes",
    "make_datasets",
    "make_jobs",
]
