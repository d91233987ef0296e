"""Outcomes of finished simulations: the metrics, the table, the goals and the plots.

Who calls it: ``tools/sim/run.py`` and the simulator's tests. It owns the metric
definitions (what counts as a hit, an idle GPU-hour, a job across subnets) and the PNGs.
matplotlib is imported only by :func:`plot` (the ``sim`` extra).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.sim.engine import Simulation
from tools.sim.policies import POLICY_NAMES as DEADLINE_POLICIES

COLUMNS = (
    ("local bytes", "local_fraction", "{:.1%}"),
    ("storage TB", "storage_tb", "{:.1f}"),
    ("inter-node TB", "inter_node_tb", "{:.1f}"),
    ("TTFS p50 s", "ttfs_p50", "{:.0f}"),
    ("TTFS mean s", "ttfs_mean", "{:.0f}"),
    ("GPU-h idle for data", "idle_gpu_h", "{:.0f}"),
    ("jobs across subnets", "across_subnets", "{:d}"),
    ("of which avoidable", "across_subnets_avoidable", "{:d}"),
    ("NUMA-split workers", "numa_split", "{:d}"),
    ("deadline misses", "misses", "{:d}"),
    ("JCT p50 h", "jct_p50_h", "{:.2f}"),
    ("JCT mean h", "jct_mean_h", "{:.2f}"),
    ("hit ratio", "hit_ratio", "{:.1%}"),
)


FIELDS: dict[str, str] = {
    "hit_ratio": "worker requests whose every byte came from the pod's own node (ours: a ready copy there at "
    "the start; the baselines: all its reads local), over all requests",
    "read_bytes": "bytes the pods read while training, every epoch (what the GPUs consume)",
    "local_read_bytes": "of read_bytes, from the pod's own node's disk",
    "local_fraction": "local_read_bytes / read_bytes: the fraction of bytes read from the node's own disk",
    "local_fraction_first_epoch": "the same over the jobs' first epochs",
    "local_fraction_later_epochs": "the same over the epochs after the first",
    "remote_read_bytes": "of read_bytes, from other nodes' caches (Fluid's workers, the JuiceFS group, peers)",
    "store_read_bytes": "of read_bytes, from the store while training",
    "inter_node_bytes": "bytes between nodes: training reads from other nodes' caches plus copies and shares "
    "fetched from peers",
    "inter_node_bytes_first_epoch": "of inter_node_bytes, all but the later epochs' reads",
    "inter_node_bytes_later_epochs": "of inter_node_bytes, the reads of the epochs after the first",
    "storage_bytes_first_epoch": "of storage_bytes, fills and the first epochs' reads",
    "storage_bytes_later_epochs": "of storage_bytes, the reads of the epochs after the first",
    "job_epochs": "the finished jobs' epochs, summed (passes over their datasets)",
    "epochs_median": "median epochs per job",
    "jobs_under_one_epoch": "jobs that read less than their whole dataset once",
    "storage_bytes_per_job_epoch": "storage_bytes / job_epochs",
    "fluid_scale_ins": "Fluid: runtimes scaled in to make room for another dataset's workers (their blocks dropped)",
    "fluid_dropped_bytes": "Fluid: cached bytes those scale-ins dropped",
    "juicefs_evicted_bytes": "JuiceFS: cached bytes the group evicted for others",
    "stripe_groups": "ours+stripe: versions striped over a group",
    "storage_bytes": "bytes read from shared storage (fills, fetches, training reads)",
    "storage_first_bytes": "of storage_bytes, the first read of each dataset version: what no policy can avoid "
    "(for this run's versions)",
    "storage_uncached_bytes": "of storage_bytes, reads not kept in a cache (ours: a miss the node had no room "
    "for; direct mode: every read)",
    "storage_bytes_by_cause": "storage_bytes by cause: first_fill (the first read of a version's bytes, kept in a "
    "cache), refetch (bytes of a version the cluster had read and kept before, read again: the copy or share was "
    "evicted, or another copy came from the store), lost_member (a lost stripe member's bundles no node could take), "
    "uncached (reads nobody keeps: no cache, no room)",
    "peer_bytes": "bytes read from other nodes' caches: P2P for ours, the cache workers for Fluid-style",
    "ttfs_mean_s": "mean time to first step: arrival to the moment every worker can train (queue + data wait)",
    "ttfs_p50_s": "median time to first step",
    "queued_ttfs_mean_s": "mean time to first step of the jobs that waited for GPUs (bound after they arrived)",
    "queued_jobs": "jobs that waited for GPUs",
    "prepare_fetch_bytes": "ours+prepare: bytes fetched into a node's cache for a waiting job (phase 2)",
    "prepare_used_bytes": "of those copies, the bytes a pod then used on that node (the rest: mispredictions)",
    "replica_fetch_bytes": "ours+replicas: bytes fetched into a node's cache for a replica",
    "replica_used_bytes": "of those copies, the bytes a pod then used on that node",
    "queued_data_wait_mean_s": "of those jobs, the mean time from binding (their GPUs free) to first step: the "
    "switch time next-job preparation overlaps with the jobs before them",
    "jobs_multi_worker": "finished jobs with more than one worker",
    "jobs_across_subnets": "multi-worker jobs whose workers' GPUs use different sets of RoCE classes",
    "jobs_across_subnets_avoidable": "of those, jobs for which, when they started, one set of class names had "
    "enough nodes with the worker's GPUs free inside it (gpu_topology.classsets.single_set_exists)",
    "deadline_jobs": "finished jobs with a deadline",
    "deadline_misses": "of those, jobs that ended at or after their deadline",
    "jct_mean_s": "mean job completion time: arrival to end (the end waits for streaming reads)",
    "gpu_hours_idle_for_data": "GPU-hours held while waiting for data: binding to first step, plus the time a "
    "streaming job ran past its compute because its reads were slower",
    "finished": "jobs that finished (all, unless the simulation was cut short)",
    "uncached_reads": "ours: misses for which eviction could not make room (the version is read, not kept)",
}


def metrics(sim: Simulation) -> dict[str, Any]:
    outs = [o for o in sim.outcomes.values() if not math.isnan(o.end)]
    ttfs = [o.first_step - o.job.arrival for o in outs]
    queued = [o.first_step - o.job.arrival for o in outs if o.start > o.job.arrival]
    queued_data = [o.first_step - o.start for o in outs if o.start > o.job.arrival]
    jct = [o.end - o.job.arrival for o in outs]
    idle = (
        sum(
            (o.first_step - o.start + max(0.0, o.end - o.compute_end)) * sum(len(w.gpus) for w in o.workers)
            for o in outs
        )
        / 3600
    )
    deadline = [o for o in outs if o.job.profile.deadline is not None]
    read, local, peer, store = sim.read_bytes, sim.read_local, sim.read_peer, sim.read_store
    epochs = [o.epochs for o in outs]

    def frac(a: float, b: float) -> float:
        return a / b if b else 0.0

    return {
        "read_bytes": sum(read),
        "local_read_bytes": sum(local),
        "local_fraction": frac(sum(local), sum(read)),
        "local_fraction_first_epoch": frac(local[0], read[0]),
        "local_fraction_later_epochs": frac(local[1], read[1]),
        "remote_read_bytes": sum(peer),
        "store_read_bytes": sum(store),
        "inter_node_bytes": sim.peer_bytes,
        "inter_node_tb": sim.peer_bytes / 1e12,
        "inter_node_bytes_first_epoch": sim.peer_bytes - peer[1],
        "inter_node_bytes_later_epochs": peer[1],
        "storage_bytes_first_epoch": sim.storage_bytes - store[1],
        "storage_bytes_later_epochs": store[1],
        "job_epochs": sum(epochs),
        "epochs_median": statistics.median(epochs) if epochs else 0.0,
        "jobs_under_one_epoch": sum(1 for e in epochs if e < 1),
        "storage_bytes_per_job_epoch": frac(sim.storage_bytes, sum(epochs)),
        "fluid_scale_ins": sim.fluid.scale_ins,
        "fluid_dropped_bytes": sim.fluid.dropped_bytes,
        "juicefs_evicted_bytes": sim.juicefs.evicted_bytes,
        "stripe_groups": len(sim.stripes),
        "epochs_capped": sim.epochs_capped,
        "policy": sim.policy,
        "jobs": len(sim.jobs),
        "finished": len(outs),
        "requests": sim.requests,
        "uncached_reads": sim.uncached_reads,
        "hit_ratio": sim.hits / sim.requests if sim.requests else 0.0,
        "storage_tb": sim.storage_bytes / 1e12,
        "storage_bytes": sim.storage_bytes,
        "storage_first_bytes": sim.storage_first_bytes,
        "storage_uncached_bytes": sim.storage_uncached_bytes,
        "storage_bytes_by_cause": dict(sim.storage_by_cause),
        "peer_bytes": sim.peer_bytes,
        "ttfs_p50": statistics.median(ttfs) if ttfs else math.nan,
        "ttfs_mean": statistics.fmean(ttfs) if ttfs else math.nan,
        "queued_ttfs_mean": statistics.fmean(queued) if queued else 0.0,
        "queued_jobs": len(queued),
        "queued_data_wait_mean": statistics.fmean(queued_data) if queued_data else 0.0,
        "task_fetch_bytes": dict(sim.task_fetch_bytes),
        "task_used_bytes": dict(sim.task_used_bytes),
        "idle_gpu_h": idle,
        "across_subnets": sum(1 for o in outs if o.spans_subnets),
        # jobs whose workers use different class sets (subnets), and those of them for which
        # one class set could hold every worker when the job started
        "across_subnets_avoidable": sum(1 for o in outs if o.spans_subnets and o.avoidable),
        "multi_worker_jobs": sum(1 for o in outs if len(o.workers) > 1),
        "numa_split": sum(o.numa_split for o in outs),
        "deadline_jobs": len(deadline),
        "misses": sum(1 for o in deadline if o.end >= (o.job.profile.deadline or math.inf)),
        "jct_p50_h": statistics.median(jct) / 3600 if jct else math.nan,
        "jct_mean_h": statistics.fmean(jct) / 3600 if jct else math.nan,
        "jct_mean": statistics.fmean(jct) if jct else math.nan,
        "ttfs": sorted(ttfs),
        "jct": sorted(jct),
        "storage_log": sim.storage_log,
    }


_BYTES_FIELDS = (
    "read_bytes",
    "local_read_bytes",
    "local_fraction",
    "local_fraction_first_epoch",
    "local_fraction_later_epochs",
    "remote_read_bytes",
    "store_read_bytes",
    "inter_node_bytes",
    "inter_node_bytes_first_epoch",
    "inter_node_bytes_later_epochs",
    "storage_bytes_first_epoch",
    "storage_bytes_later_epochs",
    "job_epochs",
    "epochs_median",
    "jobs_under_one_epoch",
    "storage_bytes_per_job_epoch",
    "fluid_scale_ins",
    "fluid_dropped_bytes",
    "juicefs_evicted_bytes",
    "stripe_groups",
)


def fields(m: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--json`` figures of one policy, named as :data:`FIELDS` documents them."""
    return {
        "hit_ratio": m["hit_ratio"],
        **{k: m[k] for k in _BYTES_FIELDS},
        "storage_bytes": m["storage_bytes"],
        "storage_first_bytes": m["storage_first_bytes"],
        "storage_uncached_bytes": m["storage_uncached_bytes"],
        "storage_bytes_by_cause": m["storage_bytes_by_cause"],
        "peer_bytes": m["peer_bytes"],
        "ttfs_mean_s": m["ttfs_mean"],
        "ttfs_p50_s": m["ttfs_p50"],
        "queued_ttfs_mean_s": m["queued_ttfs_mean"],
        "queued_jobs": m["queued_jobs"],
        "queued_data_wait_mean_s": m["queued_data_wait_mean"],
        "prepare_fetch_bytes": m["task_fetch_bytes"].get("prepare", 0),
        "prepare_used_bytes": m["task_used_bytes"].get("prepare", 0),
        "replica_fetch_bytes": m["task_fetch_bytes"].get("replica", 0),
        "replica_used_bytes": m["task_used_bytes"].get("replica", 0),
        "jobs_multi_worker": m["multi_worker_jobs"],
        "jobs_across_subnets": m["across_subnets"],
        "jobs_across_subnets_avoidable": m["across_subnets_avoidable"],
        "deadline_jobs": m["deadline_jobs"],
        "deadline_misses": m["misses"],
        "jct_mean_s": m["jct_mean"],
        "gpu_hours_idle_for_data": m["idle_gpu_h"],
        "finished": m["finished"],
        "uncached_reads": m["uncached_reads"],
    }


def table(results: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table, one row per policy."""
    head = "| policy | " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    rows = [f"| {r['policy']} | " + " | ".join(fmt.format(r[key]) for _, key, fmt in COLUMNS) + " |" for r in results]
    return "\n".join([head, rule, *rows])


def goals(results: Sequence[Mapping[str, Any]]) -> str:
    """The cluster goals, each with its measured figure and whether it is met."""
    by = {r["policy"]: r for r in results}
    lines = []
    fluids = [p for p in by if p.startswith("fluid")]
    for mine in ("ours", "ours+stripe"):
        if mine not in by or not fluids:
            continue
        o = by[mine]
        best = min(fluids, key=lambda p: by[p]["storage_tb"])  # the Fluid setting reading the store least
        f = by[best]
        storage = o["storage_tb"] / f["storage_tb"] if f["storage_tb"] else math.inf
        lines.append(
            _goal(f"{mine}: store bytes <= 1.0x the best Fluid setting ({best})", f"{storage:.2f}x", storage <= 1.0)
        )
        top = max(fluids, key=lambda p: by[p].get("local_fraction", 0.0))
        theirs = by[top].get("local_fraction", 0.0)
        local = o.get("local_fraction", 0.0) / theirs if theirs else math.inf
        lines.append(_goal(f"{mine}: local-byte fraction >= 1.5x Fluid's best ({top})", f"{local:.2f}x", local >= 1.5))
        quick = min(fluids, key=lambda p: by[p].get("ttfs_mean", math.inf))
        if "ttfs_mean" not in o or "ttfs_mean" not in by[quick]:
            continue
        ttfs = o["ttfs_mean"] / by[quick]["ttfs_mean"] if by[quick]["ttfs_mean"] else math.inf
        lines.append(_goal(f"{mine}: mean time to first step <= Fluid's best ({quick})", f"{ttfs:.2f}x", ttfs <= 1.0))
    if "ours" in by:
        lines.append(
            _goal(
                "zero jobs across subnets",
                f"{by['ours']['across_subnets']} (ours), "
                f"{by.get('ours+time', {}).get('across_subnets', '-')} (ours+time)",
                by["ours"]["across_subnets"] == 0,
            )
        )
    if {"ours", "default"} <= by.keys():
        cut = 1 - by["ours"]["ttfs_mean"] / by["default"]["ttfs_mean"] if by["default"]["ttfs_mean"] else 0.0
        lines.append(_goal("time to first step -40% vs no cache (mean)", f"{-cut:+.0%}", cut >= 0.40))
    timed = [p for p in by if p in DEADLINE_POLICIES]
    others = [r["misses"] for p, r in by.items() if p not in DEADLINE_POLICIES]
    if timed and others:
        # misses <= 0.7x the best non-deadline policy, mean JCT <= 1.05x ours
        best = min(timed, key=lambda p: (by[p]["misses"], by[p]["jct_mean_h"]))
        ratio = by[best]["misses"] / min(others) if min(others) else math.inf
        jct = by[best]["jct_mean_h"] / by["ours"]["jct_mean_h"] if "ours" in by else math.nan
        lines.append(
            _goal(
                "deadline misses <= 0.7x the best other policy, mean JCT <= 1.05x ours",
                f"{best}: {by[best]['misses']} vs {min(others)} ({ratio:.2f}x), JCT {jct:.2f}x",
                ratio <= 0.7 and jct <= 1.05,
            )
        )
    return "\n".join(lines)


def _goal(goal: str, figure: str, met: bool) -> str:
    return f"- {goal}: **{figure}** ({'met' if met else 'missed'})"


def plot(results: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """CDFs of time to first step and JCT per policy, and storage bytes over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, title, unit, scale in (
        ("ttfs", "Time to first training step", "seconds", 1.0),
        ("jct", "Job completion time", "hours", 3600.0),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for r in results:
            xs = [max(v / scale, 1e-3) for v in r[key]]
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=r["policy"])
        ax.set_xscale("log")
        ax.set_xlabel(f"{title.lower()} ({unit}, log scale; 0 drawn at 0.001)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{title}: CDF per policy")
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = out / f"sim-{key}-cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        log = r["storage_log"]
        ax.plot([t / 86400 for t, _ in log], [b / 1e12 for _, b in log], label=r["policy"])
    ax.set_xlabel("simulated time (days)")
    ax.set_ylabel("bytes read from shared storage (TB, cumulative)")
    ax.set_title("Storage reads over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = out / "sim-storage-bytes.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


__all__ = ["COLUMNS", "FIELDS", "fields", "goals", "metrics", "plot", "table"]
