"""Benchmark the admission webhook's RoCE class vote at cluster scale.

For each of ``--nodes`` (default 1,000, 5,000 and 15,000) a fake API server
(``tools/support/fake_apiserver.py``, lists served from memory) holds the cluster
``tools/bench/controller.py`` builds: N GPU Nodes with what this release's agents put on
them, each with its ``NodeCache`` (inventory and the two-class 8-GPU topology). The
webhook's class policy (``GpuClassPolicy`` over ``KubeGpuClasses``, the default ``auto``
mode) then admits ``--admissions`` multi-worker GPU pods, each of a new job and each after
the class view's 5 s time to live has passed, so that every admission reads the cluster
again: the admission a pod waits for at most once every 5 s. Twice per size:

- ``list``: the Nodes and NodeCaches listed at the admission (``webhook.watchNodes: false``),
  the baseline;
- ``watch``: kept by list+watch (``dsagent/kube/nodewatch.py``, the default), synced first.

Printed and written to ``--json`` (tools/bench/support/record.py): the median and the
slowest admission per size and mode, the ratio of the two modes' medians, and the load
average beside each. Goal: at 15,000 nodes such an admission within 1 s, a fifth of the
chart's ``webhook.timeoutSeconds`` (5 s; past it the API server admits the pod unchanged).

And the memory the default mode holds: a process of its own (this script with
``--child``, as the webhook's is) starts the node watch, waits for its first list, admits
one pod from a fresh class view and reports its peak resident set (``VmHWM``); the goal at
15,000 nodes is the chart's ``webhook.resources.limits.memory`` (768 Mi), past which the
webhook restarts and pods are admitted unchanged.

    .venv/bin/python tools/bench/webhook.py --json docs/results/performance/webhook.json
    .venv/bin/python tools/bench/webhook.py --smoke          # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.bench.support.record import Record  # noqa: E402

GOAL_ADMISSION_S_15K = 1.0
TTL_PAST_S = 6.0  # the view's time to live is 5 s
#: the chart's ``webhook.resources.limits.memory`` (charts/dsplatform/values.yaml)
GOAL_PEAK_BYTES_15K = 768 << 20


def load() -> float:
    return os.getloadavg()[0]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def admissions(url: str, count: int, watched: bool, tag: str = "") -> list[float]:
    """Seconds per admission of ``count`` multi-worker pods, each reading the view again
    (each of a job of its own: ``tag`` sets the jobs of one caller apart from another's)."""
    from kubernetes import client

    from dsagent.kube.nodewatch import NodeWatch
    from dsagent.webhook.gpurequest import GpuClassSettings
    from dsagent.webhook.roceclass import GpuClassPolicy, KubeGpuClasses
    from dsplatform.jobs import WORKERS_ANNOTATION
    from tools.support.fake_apiserver import make_pod

    config = client.Configuration()
    config.host = url
    api = client.ApiClient(config)
    watch = NodeWatch(api, watch_timeout_s=300) if watched else None
    try:
        if watch is not None:
            watch.start()
            if not watch.wait_synced(600):
                raise SystemExit("the node watch did not list the nodes within 600 s")
        settings, clock = GpuClassSettings(enabled="auto"), Clock()
        policy = GpuClassPolicy(settings, KubeGpuClasses(api, settings, clock=clock, watch=watch))
        seconds = []
        for i in range(count):
            clock.now += TTL_PAST_S
            job = f"bench-{tag or ('w' if watched else 'l')}-{i}"
            labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-index": "0"}
            owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job, "uid": f"uid-{job}"}
            pod = make_pod(f"{job}-worker-0", namespace="ml", labels=labels, gpus=4)
            pod["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
            pod["metadata"].setdefault("annotations", {})[WORKERS_ANNOTATION] = "2"  # a class set for two
            views = policy.kube.cluster_reads
            started = time.perf_counter()
            decision = policy.decide(pod, "ml", annotations_exist=True)
            seconds.append(time.perf_counter() - started)
            if decision.gpu_class is None or policy.kube.cluster_reads != views + 1:
                raise SystemExit(f"the admission at {url} chose no class from a fresh view: {decision}")
        return seconds
    finally:
        if watch is not None:
            watch.stop()
        api.close()


def child(url: str) -> None:
    """The webhook's memory in a process of its own: the node watch synced, one admission
    from a fresh class view, then this process's peak resident set, as JSON on stdout."""
    from tools.bench.controller import rss_status

    seconds = admissions(url, 1, watched=True, tag="process")
    print(json.dumps({"peak_rss_bytes": rss_status()["VmHWM"], "admission_s": seconds[0]}), flush=True)


def peak_in_child(url: str) -> int:
    done = subprocess.run(
        [sys.executable, __file__, "--child", url], capture_output=True, text=True, timeout=1200, cwd=ROOT
    )
    if done.returncode != 0:
        raise SystemExit(f"the webhook's process failed: {done.stderr.strip()[-2000:]}")
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_bytes"])


def run_size(nodes: int, count: int) -> dict[str, Any]:
    from tools.bench.controller import build
    from tools.support.fake_apiserver import FakeApiServer

    objects = build(nodes, 50, 12)
    out: dict[str, Any] = {"nodes": nodes}
    with FakeApiServer(list_cache=True) as fake:
        for kind in ("nodes", "nodecaches"):
            for obj in objects[kind]:
                fake.create(obj)
        fake.store.log.clear()  # the watches start from a list made after this
        for mode in ("list", "watch"):
            seconds = admissions(fake.url, count, watched=mode == "watch")
            out[mode] = {"median_s": statistics.median(seconds), "max_s": max(seconds), "load": load()}
        out["peak_rss_bytes"] = peak_in_child(fake.url)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,5000,15000", help="comma-separated cluster sizes")
    parser.add_argument("--admissions", type=int, default=5, help="admissions per size and mode")
    parser.add_argument("--json", type=Path, help="write the results here (tools/bench/support/record.py)")
    parser.add_argument("--workdir", type=Path, help="unused: every benchmark takes it")
    parser.add_argument("--smoke", action="store_true", help="seconds: 100 nodes, 2 admissions")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child)
        return
    if opts.smoke:
        opts.nodes, opts.admissions = "100", 2
    sizes = [int(s) for s in opts.nodes.split(",")]
    record = Record("webhook", {"nodes": sizes, "admissions": opts.admissions, "view_ttl_s": 5})
    print(f"# load average at the start: {load():.2f} ({os.cpu_count()} CPUs)")
    print(f"{'nodes':>6} {'nodes by':>8} {'median s':>9} {'slowest s':>10} {'load':>6}")
    results = {}
    for size in sizes:
        result = results[size] = run_size(size, opts.admissions)
        for mode in ("list", "watch"):
            figures = result[mode]
            print(f"{size:>6} {mode:>8} {figures['median_s']:>9.3f} {figures['max_s']:>10.3f} {figures['load']:>6.2f}")
            suffix = "" if mode == "watch" else " (Nodes listed at the admission)"
            # the memory the default mode holds, measured in a process of its own
            peak = {"peak_rss_bytes": result["peak_rss_bytes"]} if mode == "watch" else {}
            record.row(
                f"admission reading the class view at {size} nodes{suffix}", "webhook", figures["median_s"],
                nodes=size, median_s=figures["median_s"], max_s=figures["max_s"], load=figures["load"], **peak,
            )  # fmt: skip
        faster = result["list"]["median_s"] / result["watch"]["median_s"]
        record.ratio(
            f"webhook admission reading the class view at {size:,} nodes: Nodes listed / watched",
            faster,
            None,
            f"{result['list']['median_s']:.3f} s / {result['watch']['median_s']:.3f} s; load {load():.2f}",
        )
        print(f"# at {size} nodes an admission with the Nodes watched is {faster:.2f}x one listing them", flush=True)
        print(f"# at {size} nodes the webhook's process peaks at {result['peak_rss_bytes'] >> 20} MiB", flush=True)
    if 15000 in results:
        median = results[15000]["watch"]["median_s"]
        record.ratio(
            f"webhook admission reading the class view at 15,000 nodes: {GOAL_ADMISSION_S_15K:g} s / measured",
            GOAL_ADMISSION_S_15K / median,
            1.0,
            f"{median:.3f} s; load {results[15000]['watch']['load']:.2f}",
        )
        print(
            f"goal: admission reading the view at 15,000 nodes <= {GOAL_ADMISSION_S_15K:g} s: {median:.3f} s "
            f"({'met' if median <= GOAL_ADMISSION_S_15K else 'NOT met'})"
        )
        peak = results[15000]["peak_rss_bytes"]
        record.ratio(
            "webhook peak RSS at 15,000 nodes: the chart's limit / measured",
            GOAL_PEAK_BYTES_15K / peak,
            1.0,
            f"{peak / (1 << 20):.0f} MiB (the process's VmHWM); limit {GOAL_PEAK_BYTES_15K >> 20} MiB",
        )
    print(f"# load average at the end: {load():.2f}")
    record.write(opts.json)


if __name__ == "__main__":
    main()
