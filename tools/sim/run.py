"""Run the four policies on one simulated cluster and workload; print the table, draw the plots.

    python tools/sim/run.py                      # 500 nodes, 5,000 jobs, seed 1 (minutes on 2 cores)
    python tools/sim/run.py --smoke              # 20 nodes, 150 jobs (seconds)
    python tools/sim/run.py --nodes 100 --jobs 1000 --load 0.9 --seed 7 --out /tmp/sim

The policies run side by side, on the same jobs, in ``--procs`` processes. Who calls it: a
person, and ``tests/tools/test_sim.py`` (``--smoke``). See tools/sim/engine.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.sim import report  # noqa: E402
from tools.sim.engine import POLICIES, ClusterParams, Simulation  # noqa: E402
from tools.sim.workload import WorkloadParams, make_jobs  # noqa: E402

# the deadline variants not listed run with --policies (tools/sim/deadline.py names them)
DEFAULT_POLICIES = ("default", "fluid", "ours", "ours+time", "deadline-slack")


def simulate(policy: str, nodes: int, workload: WorkloadParams, seed: int) -> dict[str, Any]:
    cluster = ClusterParams(nodes=nodes)
    gpus_per_node = 8  # every node type in ClusterParams has 8 GPUs
    jobs, datasets = make_jobs(workload, nodes * gpus_per_node, seed)
    started = time.perf_counter()
    sim = Simulation(policy, jobs, datasets, cluster, seed).run()
    result = report.metrics(sim)
    result["seconds"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--load", type=float, default=WorkloadParams.load)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, from: {', '.join(POLICIES)}",
    )
    parser.add_argument(
        "--deadlines",
        choices=("eq6", "asked"),
        default=WorkloadParams.deadline_rule,
        help="eq6: alpha x run time on one GPU (design eq. 6); asked: alpha x run time on the GPUs asked for",
    )
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="20 nodes, 150 jobs, no plots unless --out")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs and results.json go")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.jobs = 20, 150
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or args.nodes < 1 or args.jobs < 1 or not 0 < args.load <= 2:
        parser.error(f"bad arguments: unknown policies {unknown}" if unknown else "nodes, jobs >= 1, 0 < load <= 2")
    workload = replace(WorkloadParams(), jobs=args.jobs, load=args.load, deadline_rule=args.deadlines)
    # smaller datasets keep a small cluster's caches meaningful
    if args.smoke:
        workload = replace(workload, datasets=40)
    started = time.perf_counter()
    if args.procs > 1 and len(policies) > 1:
        with ProcessPoolExecutor(max_workers=args.procs) as pool:
            futures = [pool.submit(simulate, p, args.nodes, workload, args.seed) for p in policies]
            results = [f.result() for f in futures]
    else:
        results = [simulate(p, args.nodes, workload, args.seed) for p in policies]
    elapsed = time.perf_counter() - started
    print(
        f"{args.nodes} nodes, {args.jobs} jobs, load {args.load}, seed {args.seed}, deadlines {args.deadlines}; "
        f"job run times from Philly (tools/sim/data/philly_runtime.csv); {elapsed:.0f} s"
    )
    print()
    print(report.table(results))
    print()
    print(report.goals(results))
    out = args.out if args.out is not None else (None if args.smoke else REPO / "tools" / "sim" / "out")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        slim = [{k: v for k, v in r.items() if k not in ("ttfs", "jct", "storage_log")} for r in results]
        (out / "results.json").write_text(json.dumps(slim, indent=1) + "\n")
        if not args.no_plots:
            for path in report.plot(results, out):
                print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
