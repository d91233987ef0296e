"""Run the policies on one simulated cluster and workload; print the table, write JSON and plots.

    python tools/sim/run.py                                   # the default preset: 500 nodes, 5,000 jobs
    python tools/sim/run.py --smoke                           # 20 nodes, 150 jobs (seconds)
    python tools/sim/run.py --workload tools/sim/workloads/multi-tb.json --json /tmp/r.json
    python tools/sim/run.py --list-node-types                 # node types for a workload file's "nodes"
    python tools/sim/run.py --policies all ...                # every policy, the deadline variants too

Every workload parameter is in one JSON file (``--workload``; the schema and its defaults
are tools/sim/workload_file.py, presets in tools/sim/workloads/); ``--jobs``, ``--load`` and
``--seed`` override the file's. The policies run side by side, on the same jobs, in
``--procs`` processes. Who calls it: a person, ``tools/sim/sweep.py`` (:func:`simulate`) and
``tests/tools/test_sim.py``. Exit codes: 0 done, 2 bad arguments or workload file (one line
on stderr). See tools/sim/engine.py for the model and report.py for the JSON fields.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: where the published run's plots go: the documentation shows them from there
PLOTS = REPO / "docs" / "assets" / "sim"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.sim import nodetypes, rates, report  # noqa: E402
from tools.sim.engine import Simulation  # noqa: E402
from tools.sim.model import model_stamp  # noqa: E402
from tools.sim.policies import POLICIES, PRODUCT_POLICY  # noqa: E402
from tools.sim.workload import input_changes, make_jobs  # noqa: E402
from tools.sim.workload_file import WorkloadError, WorkloadFile, load, total_gpus  # noqa: E402

WORKLOADS = Path(__file__).resolve().parent / "workloads"
DEFAULT = WORKLOADS / "default.json"
SMOKE = WORKLOADS / "smoke.json"

# no cache, Fluid at three replica settings and Exclusive placement, the JuiceFS group, ours
# and its variants; the other deadline variants run with --policies (or all)
DEFAULT_POLICIES = (
    "default",
    "fluid-r1",
    "fluid-r4",
    "fluid",
    "fluid-excl",
    "fluid-r4+passive",
    "fluid-job",
    "juicefs",
    "juicefs+pack",
    "ours",
    "ours+time",
    "ours+prepare",
    "ours+replicas",
    "ours+stripe",
    "ours+stripe+early",
    "deadline-slack",
)


def simulate(policy: str, wf: WorkloadFile) -> dict[str, Any]:
    """One policy over the workload file's cluster and jobs: :func:`report.metrics`."""
    cluster = wf.cluster()
    jobs, datasets = make_jobs(wf.workload(), total_gpus(cluster), wf.seed)
    started = time.perf_counter()
    sim = Simulation(policy, jobs, datasets, cluster, wf.seed).run()
    result = report.metrics(sim)
    result["seconds"] = time.perf_counter() - started
    changes = input_changes(wf.workload(), jobs, datasets)
    if sim.epochs_capped:
        changes.append(f"{sim.epochs_capped} of {len(jobs)} jobs' derived epochs lowered to max_epochs")
    result["input_changes"] = changes
    return result


def rate_table(wf: WorkloadFile) -> dict[str, Any]:
    """The rates a run used, each with its source (tools/sim/rates.py), and the NICs."""
    cluster = wf.cluster()
    nic = {k: v for k, (v, _) in rates.NIC.items()}
    nic.update(dict(cluster.nic_bw))
    sources = {c.name: c.source for c in rates.READ_MIX}
    return {
        "rates": rates.table(cluster.rate_values()),
        "gpu_read_mix": [
            {"name": name, "share": share, "bytes_per_s": bps, "source": sources.get(name, "workload file")}
            for name, share, bps in cluster.gpu_read_mix
        ],
        "storage_bytes_per_s": {"value": cluster.storage_bw, "source": "workload file (all nodes together)"},
        "nic_bytes_per_s": [
            {"type": t, "value": nic[t], "default": nic[t] == rates.NIC[t][0], "source": rates.NIC[t][1]}
            for t in sorted({g.type for g in wf.nodes})
        ],
    }


def run_all(wf: WorkloadFile, policies: list[str], procs: int) -> list[dict[str, Any]]:
    if procs > 1 and len(policies) > 1:
        with ProcessPoolExecutor(max_workers=procs) as pool:
            futures = [pool.submit(simulate, p, wf) for p in policies]
            return [f.result() for f in futures]
    return [simulate(p, wf) for p in policies]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, default=None, help=f"workload JSON (default {DEFAULT.name})")
    parser.add_argument("--list-node-types", action="store_true", help="print the node types as JSON and exit")
    parser.add_argument("--jobs", type=int, default=None, help="override the file's jobs.count")
    parser.add_argument("--load", type=float, default=None, help="override the file's jobs.load")
    parser.add_argument("--seed", type=int, default=None, help="override the file's seed")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, or all; from: {', '.join(POLICIES)}",
    )
    parser.add_argument(
        "--deadlines",
        choices=("eq6", "asked"),
        default=None,
        help="override the file's jobs.deadline_rule (eq6: alpha x run time on one GPU, design eq. 6; "
        "asked: alpha x run time on the GPUs asked for)",
    )
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help=f"the {SMOKE.name} preset, no plots unless --out")
    parser.add_argument("--json", type=Path, default=None, help="write the per-policy figures (report.FIELDS) here")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs and results.json go")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if args.list_node_types:
        print(json.dumps(nodetypes.describe(), indent=1))
        return 0
    if args.smoke and args.workload is not None:
        parser.error("--smoke and --workload: choose one")
    policies = list(POLICIES) if args.policies == "all" else [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        parser.error(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    path = SMOKE if args.smoke else (args.workload or DEFAULT)
    try:
        wf = load(path)
        overrides: dict[str, Any] = {}
        if args.seed is not None:
            overrides["seed"] = args.seed
        jobs = {
            k: v
            for k, v in (("count", args.jobs), ("load", args.load), ("deadline_rule", args.deadlines))
            if v is not None
        }
        if jobs:
            overrides["jobs"] = {**wf.jobs.model_dump(), **jobs}
        if overrides:
            wf = WorkloadFile.model_validate({**wf.model_dump(), **overrides})
    except WorkloadError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # a pydantic ValidationError from an override
        print(f"run.py: bad override: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    model = model_stamp()  # the code as the run starts: what its documents say made them
    started = time.perf_counter()
    results = run_all(wf, policies, args.procs)
    elapsed = time.perf_counter() - started
    print(
        f"{path.name}: {wf.cluster().nodes} nodes, {wf.jobs.count} jobs, load {wf.jobs.load}, seed {wf.seed}, "
        f"deadlines {wf.jobs.deadline_rule}; "
        f"job run times from Philly (tools/sim/data/philly_runtime.csv); {elapsed:.0f} s"
    )
    print()
    print(report.table(results))
    print()
    print(report.goals(results))
    changes = results[0]["input_changes"] if results else []
    for line in changes:
        print(f"input changed: {line}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "model": model,
            "product_policy": PRODUCT_POLICY,
            "workload": wf.model_dump(mode="json"),
            **rate_table(wf),
            "input_changes": changes,
            "seconds": elapsed,
            "policies": {r["policy"]: report.fields(r) for r in results},
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    out = args.out if args.out is not None else (None if args.smoke or args.workload else REPO / "tools/sim/out")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        slim = [
            {k: v for k, v in r.items() if k not in ("ttfs", "jct", "storage_log", "input_changes")} for r in results
        ]
        (out / "results.json").write_text(json.dumps({"model": model, "runs": slim}, indent=1) + "\n")
        if not args.no_plots:  # the published run's plots go where docs/simulation.md shows them
            plots = PLOTS if args.out is None else out
            plots.mkdir(parents=True, exist_ok=True)
            for p in report.plot(results, plots):
                print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
