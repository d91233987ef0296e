"""Benchmark the node agents' writes of their own state to the API server under churn: writes
per node-hour and bytes per write.

Each simulated node runs the agent's real publishing rule on a simulated clock: every wake
it builds its state with the real builders (``dsagent.nodeagent.publisher.node_state`` for
the ``NodeCache``, ``node_annotations`` / ``annotation_patch`` for the Node's free-GPU
annotation), asks the real :class:`dsagent.nodeagent.statewrites.Coalescer` (one per
object, the agent's interval and heartbeat) whether to write, measures each write's body
as the agent sends it (``dsplatform.wire.nodecache.merge_patch`` of the new status against
the last written, ``publishedAt`` included; the annotation merge patch), and sleeps as the
agent does (``ClusterAgent._next_publish_s``: the interval, or sooner when a held-back
state is due).

The events, per node, over ``--hours`` (default 1) simulated hours:

- training pods arrive as a Poisson process (``--pods-per-hour``, default 12 per node-hour)
  asking for 1, 2, 4 or 8 of the node's 8 GPUs (weights 2:2:3:3) and run for an
  exponential time (``--pod-minutes``, mean 20 min); a pod that does not fit is not placed
  here. Traces of shared GPU clusters report most jobs lasting minutes to an hour (Microsoft
  Philly, Jeon et al., USENIX ATC 2019; SenseTime Helios, Hu et al., SC 2021), so 12 starts
  and 12 ends a node-hour is a busy node: the free-GPU annotation changes 24 times;
- each pod reads one or two datasets of a catalog of 200 (Zipf popularity, s = 1.1; sizes
  log-uniform from 10 GiB to 1 TiB): a dataset already cached is a hit (``inUse`` while it
  runs, ``lastUsed`` at its start); a miss is fetched at ``--fetch-gbps`` (default 2 GB/s,
  a node's 25 Gb/s link), its ``heldBytes`` growing while it fetches, and the least
  recently used datasets not in use are evicted to make room on the node's 7 TB cache;
- free bytes move with fetches and evictions (rounded as the agent publishes them).

Printed and written to ``--json``: writes per node-hour (mean and max over the nodes,
``nodecache`` and ``node`` apart and together) and bytes per write (mean and max, per
object). Goal: at most one write per node per 10 s on average (<= 360 per node-hour).

    .venv/bin/python tools/bench/agent_writes.py --json docs/results/performance/agent-writes.json
    .venv/bin/python tools/bench/agent_writes.py --pods-per-hour 30     # heavier churn
    .venv/bin/python tools/bench/agent_writes.py --smoke                # seconds
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dsagent.nodeagent import publisher  # noqa: E402
from dsagent.nodeagent.clustersettings import ClusterSettings  # noqa: E402
from dsagent.nodeagent.statewrites import Coalescer  # noqa: E402
from dsplatform.kubetime import format_time  # noqa: E402
from dsplatform.wire import inventory as wire_inventory  # noqa: E402
from dsplatform.wire import nodecache  # noqa: E402
from scheduler_plugin.testing import topology_json  # noqa: E402
from tools.bench.support.record import Record  # noqa: E402

GIB = 1 << 30
CAPACITY = 7 * 10**12
CATALOG = 200
GOAL_PER_NODE_HOUR = 360.0
START = 1_800_000_000.0


@dataclass
class Copy:
    size: int
    done: int
    digest: str
    fetch_started: float | None = None
    last_used: float = 0.0
    users: int = 0


@dataclass
class Node:
    name: str
    rng: random.Random
    sizes: list[int]
    weights: list[float]
    fetch_bps: float
    free_gpus: set[int] = field(default_factory=lambda: set(range(8)))
    copies: dict[str, Copy] = field(default_factory=dict)
    pods: list[tuple[float, list[int], list[str]]] = field(default_factory=list)  # (end, gpus, datasets)

    def advance(self, now: float) -> None:
        """Fetch progress up to ``now``, then the pods that ended by then."""
        for copy in self.copies.values():
            if copy.fetch_started is not None:
                copy.done = min(copy.size, int((now - copy.fetch_started) * self.fetch_bps))
                if copy.done >= copy.size:
                    copy.fetch_started = None
        while self.pods and self.pods[0][0] <= now:
            _, gpus, names = heapq.heappop(self.pods)
            self.free_gpus.update(gpus)
            for name in names:
                if name in self.copies:
                    self.copies[name].users -= 1

    def start_pod(self, now: float, minutes: float) -> None:
        need = self.rng.choices((1, 2, 4, 8), weights=(2, 2, 3, 3))[0]
        if len(self.free_gpus) < need:
            return  # placed elsewhere
        gpus = sorted(self.free_gpus)[:need]
        self.free_gpus.difference_update(gpus)
        wanted = set(self.rng.choices(range(CATALOG), weights=self.weights, k=self.rng.choice((1, 2))))
        names = [f"ds-{i:03d}" for i in sorted(wanted)]
        for name, index in zip(names, sorted(wanted)):
            copy = self.copies.get(name)
            if copy is None:
                self.make_room(self.sizes[index])
                copy = self.copies[name] = Copy(self.sizes[index], 0, f"{index:032x}", fetch_started=now)
            copy.users += 1
            copy.last_used = now
        heapq.heappush(self.pods, (now + self.rng.expovariate(1 / (minutes * 60)), gpus, names))

    def make_room(self, size: int) -> None:
        """Evict the least recently used copies not in use until ``size`` fits."""
        idle = sorted((c.last_used, n) for n, c in self.copies.items() if c.users == 0 and c.fetch_started is None)
        while self.used() + size > CAPACITY and idle:
            del self.copies[idle.pop(0)[1]]

    def used(self) -> int:
        return sum(c.done if c.fetch_started is not None else c.size for c in self.copies.values())

    def inventory(self) -> dict[str, Any]:
        """The inventory document the agent builds (dsplatform.wire.inventory)."""
        datasets = {}
        for name, copy in sorted(self.copies.items()):
            fetching = copy.fetch_started is not None
            view = {
                "digest": copy.digest,
                "sizeBytes": copy.size,
                "files": 1000 + copy.size // (4 << 20),
                "state": "fetching" if fetching else "ready",
                "inUse": copy.users > 0,
                "lastUsed": format_time(copy.last_used) if copy.last_used else None,
                "bytesDone": copy.done,
            }
            datasets[name] = wire_inventory.dataset_entry([view])
        return wire_inventory.document(
            self.name, capacity_bytes=CAPACITY, free_bytes=CAPACITY - self.used(), datasets=datasets
        )


def warm_cache(node: Node, now: float) -> None:
    """Start from a cache filled by earlier work: popular datasets, idle and ready."""
    for index in sorted(range(CATALOG), key=lambda i: -node.weights[i]):
        size = node.sizes[index]
        if node.used() + size > CAPACITY * 0.85:
            continue
        node.copies[f"ds-{index:03d}"] = Copy(size, size, f"{index:032x}", last_used=now - node.rng.uniform(0, 86400))


def simulate(name: str, seed: int, opts: argparse.Namespace, settings: ClusterSettings) -> dict[str, Any]:
    rng = random.Random(seed)
    catalog_rng = random.Random(1)  # one catalog for every node
    sizes = [int(math.exp(catalog_rng.uniform(math.log(10 * GIB), math.log(1024 * GIB)))) for _ in range(CATALOG)]
    weights = [1 / (i + 1) ** 1.1 for i in range(CATALOG)]
    node = Node(name, rng, sizes, weights, opts.fetch_gbps * 1e9)
    warm_cache(node, START)
    topology = topology_json()
    interval, heartbeat = settings.publish_interval, settings.publish_heartbeat
    cache_writes: Coalescer[dict[str, str]] = Coalescer(interval, heartbeat)
    node_writes: Coalescer[dict[str, str]] = Coalescer(interval)
    written_status: dict[str, Any] | None = None
    annotations: dict[str, str] = {}
    sizes_by_object: dict[str, list[int]] = {"nodecache": [], "node": []}
    end = START + opts.hours * 3600
    arrivals = START + rng.expovariate(opts.pods_per_hour / 3600)
    now = START + rng.uniform(0, interval)  # agents do not start in step
    while now < end:
        while arrivals <= now:
            node.advance(arrivals)
            node.start_pod(arrivals, opts.pod_minutes)
            arrivals += rng.expovariate(opts.pods_per_hour / 3600)
        node.advance(now)
        # ClusterAgent.publish_once, on the simulated clock
        state = publisher.node_state(node.inventory(), topology)
        desired = publisher.node_annotations(sorted(node.free_gpus))
        if cache_writes.due(state, now):
            status = nodecache.status(state.get("inventory"), state.get("topology"), format_time(now))
            body = nodecache.merge_patch(status, written_status)
            sizes_by_object["nodecache"].append(len(json.dumps(body)))
            cache_writes.wrote(state, now)
            written_status = status
        patch = publisher.annotation_patch(annotations, desired)
        if patch is not None and node_writes.due(desired, now):
            sizes_by_object["node"].append(len(json.dumps({"metadata": {"annotations": patch}})))
            node_writes.wrote(desired, now)
            annotations = publisher.applied(annotations, patch)
        # ClusterAgent._next_publish_s
        waits = [w for w in (cache_writes.wait_s(now), node_writes.wait_s(now)) if w is not None]
        now += min([interval, *waits]) if waits else interval
    hours = opts.hours
    return {
        "writes_per_hour": {k: len(v) / hours for k, v in sizes_by_object.items()},
        "bytes": sizes_by_object,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200, help="nodes simulated (each on its own)")
    parser.add_argument("--hours", type=float, default=1.0, help="simulated hours")
    parser.add_argument("--pods-per-hour", type=float, default=12.0, help="pod arrivals per node-hour")
    parser.add_argument("--pod-minutes", type=float, default=20.0, help="mean pod run time, minutes")
    parser.add_argument("--fetch-gbps", type=float, default=2.0, help="a node's fetch rate, GB/s")
    parser.add_argument("--json", type=Path, help="write the results here (tools/bench/support/record.py)")
    parser.add_argument("--workdir", type=Path, help="unused (every benchmark takes it)")
    parser.add_argument("--smoke", action="store_true", help="seconds: 10 nodes, a quarter hour")
    opts = parser.parse_args()
    if opts.smoke:
        opts.nodes, opts.hours = 10, 0.25
    settings = ClusterSettings()
    record = Record(
        "agent_writes",
        {
            "nodes": opts.nodes,
            "hours": opts.hours,
            "pods_per_hour": opts.pods_per_hour,
            "pod_minutes": opts.pod_minutes,
            "fetch_gbps": opts.fetch_gbps,
            "publish_interval_s": settings.publish_interval,
            "publish_heartbeat_s": settings.publish_heartbeat,
        },
    )
    print(f"# load average at the start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(
        f"# {opts.nodes} nodes, {opts.hours:g} h simulated, {opts.pods_per_hour:g} pods/node-hour of "
        f"{opts.pod_minutes:g} min mean, fetches at {opts.fetch_gbps:g} GB/s, interval {settings.publish_interval:g} s"
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    runs = [simulate(f"gpu-node-{i:05d}", 1000 + i, opts, settings) for i in range(opts.nodes)]
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"{'object':10} {'writes/node-h mean':>19} {'max':>6} {'bytes/write mean':>17} {'max':>7}")
    totals = [sum(r["writes_per_hour"].values()) for r in runs]
    for kind in ("nodecache", "node"):
        per_hour = [r["writes_per_hour"][kind] for r in runs]
        sizes = [s for r in runs for s in r["bytes"][kind]]
        mean_bytes = statistics.fmean(sizes) if sizes else 0.0
        print(
            f"{kind:10} {statistics.fmean(per_hour):>19.1f} {max(per_hour):>6.0f} {mean_bytes:>17.0f} "
            f"{max(sizes, default=0):>7}"
        )
        record.row(
            f"writes of the {kind}",
            "agent",
            wall,
            cpu,
            writes_per_node_hour_mean=statistics.fmean(per_hour),
            writes_per_node_hour_max=max(per_hour),
            bytes_per_write_mean=mean_bytes,
            bytes_per_write_max=max(sizes, default=0),
        )
    all_sizes = [s for r in runs for k in ("nodecache", "node") for s in r["bytes"][k]]
    mean_total = statistics.fmean(totals)
    print(
        f"{'both':10} {mean_total:>19.1f} {max(totals):>6.0f} {statistics.fmean(all_sizes):>17.0f} {max(all_sizes):>7}"
    )
    record.row(
        "writes of both",
        "agent",
        wall,
        cpu,
        writes_per_node_hour_mean=mean_total,
        writes_per_node_hour_max=max(totals),
        bytes_per_write_mean=statistics.fmean(all_sizes),
        bytes_per_write_max=max(all_sizes),
    )
    load = os.getloadavg()[0]
    record.ratio(
        "agent writes per node-hour under churn: 360 / measured",
        GOAL_PER_NODE_HOUR / mean_total if mean_total else None,
        1.0,
        f"{mean_total:.0f} writes/node-hour (max {max(totals):.0f}), {statistics.fmean(all_sizes):.0f} B/write mean; "
        f"load {load:.2f}",
    )
    verdict = "met" if mean_total <= GOAL_PER_NODE_HOUR else "NOT met"
    print(
        f"goal: <= {GOAL_PER_NODE_HOUR:.0f} writes per node-hour on average: {mean_total:.1f} ({verdict}); "
        f"load {load:.2f}"
    )
    print(f"# simulated in {wall:.1f} s; load average at the end: {os.getloadavg()[0]:.2f}")
    record.write(opts.json)


if __name__ == "__main__":
    main()
