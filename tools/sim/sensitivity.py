"""The rates that decide ours against the rivals, swept: store read per node x remote-cache read x
the job mix x the cores the agent's fetch finds.

    python tools/sim/sensitivity.py                  # writes tools/sim/out/results/sensitivity.json
    python tools/sim/sensitivity.py --smoke --out /tmp/s

On one workload (``--workload``, default ``results-base`` at 30 nodes and 300 jobs), every
combination of ``store_read_bytes_per_s_per_node`` and ``node_serve_bytes_per_s`` at
:data:`FACTORS` times their defaults (``tools/sim/rates.py``), of the language jobs' share
of the read-rate mix at :data:`LANGUAGE_SHARES` (``rates.READ_MIX``) and of our agent's fetch
rate at :data:`FETCH_CORES` cores' worth of unpacking (``rates.UNPACK_PER_CORE``: the default
takes a core for each of the agent's fetch workers, a busy node may give it fewer) runs :data:`POLICIES`; the
JSON holds each point's rates and every policy's ``run.py --json`` figures, and
``results.py`` renders it on the results page. Who calls it: a person, and the simulator's
tests (``--smoke``). Exit codes: 0 done, 2 bad arguments or workload file.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.sim import rates, report  # noqa: E402
from tools.sim.model import model_stamp  # noqa: E402
from tools.sim.policies import PRODUCT_POLICY  # noqa: E402
from tools.sim.run import WORKLOADS, simulate  # noqa: E402
from tools.sim.workload_file import WorkloadError, WorkloadFile, load  # noqa: E402

FACTORS = (0.5, 1.0, 2.0)
LANGUAGE_SHARES = (0.0, 0.5, 0.9)
FETCH_CORES = (2, rates.FETCH_WORKERS)
POLICIES = ("fluid-r4", "fluid", "fluid-r4+passive", "juicefs", "juicefs+pack", "ours", "ours+stripe", PRODUCT_POLICY)
KEYS = (rates.STORE_PER_NODE.key, rates.REMOTE_CACHE.key, "language_share", rates.UNPACK.key)


def points(
    wf: WorkloadFile,
    factors: tuple[float, ...],
    shares: tuple[float, ...] = LANGUAGE_SHARES,
    cores: tuple[int, ...] = FETCH_CORES,
) -> list[tuple[dict[str, float], WorkloadFile]]:
    out = []
    base = {k: float(getattr(wf, k)) for k in KEYS[:2]}
    vision, language = rates.VISION_READ, rates.LANGUAGE_READ
    for a in factors:
        for b in factors:
            for share in shares:
                for n in cores:
                    values = {
                        KEYS[0]: base[KEYS[0]] * a,
                        KEYS[1]: base[KEYS[1]] * b,
                        KEYS[2]: share,
                        KEYS[3]: rates.UNPACK_PER_CORE * n,
                    }
                    mix = [
                        {"name": c.name, "share": part, "bytes_per_s": c.bytes_per_s}
                        for c, part in ((vision, 1.0 - share), (language, share))
                        if part > 0
                    ]
                    update = {k: values[k] for k in (KEYS[0], KEYS[1], KEYS[3])}
                    update["gpu_read_mix"] = mix  # type: ignore[assignment]
                    out.append((values, WorkloadFile.model_validate({**wf.model_dump(), **update})))
    return out


def shrink(wf: WorkloadFile, nodes: int, jobs: int) -> WorkloadFile:
    total = sum(g.count for g in wf.nodes)
    groups = [g.model_copy(update={"count": max(1, round(nodes * g.count / total))}) for g in wf.nodes]
    return wf.model_copy(update={"nodes": groups, "jobs": wf.jobs.model_copy(update={"count": jobs})})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, default=WORKLOADS / "results-base.json")
    parser.add_argument("--out", type=Path, default=REPO / "tools/sim/out/results")
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="10 nodes, 40 jobs, two factors")
    args = parser.parse_args(argv)
    try:
        wf = load(args.workload)
    except WorkloadError as e:
        print(f"sensitivity.py: {e}", file=sys.stderr)
        return 2
    nodes, jobs = (10, 40) if args.smoke else (args.nodes, args.jobs)
    wf = shrink(wf, nodes, jobs)
    grid = points(wf, (0.5, 2.0), (0.0, 0.9), (2,)) if args.smoke else points(wf, FACTORS)
    tasks = [(i, p) for i in range(len(grid)) for p in POLICIES]
    if args.procs > 1:
        with ProcessPoolExecutor(max_workers=args.procs) as pool:
            done = list(pool.map(simulate, [p for _, p in tasks], [grid[i][1] for i, _ in tasks]))
    else:
        done = [simulate(p, grid[i][1]) for i, p in tasks]
    rows: list[dict[str, Any]] = [{"rates": values, "policies": {}} for values, _ in grid]
    for (i, p), result in zip(tasks, done):
        rows[i]["policies"][p] = report.fields(result)
    doc = {"model": model_stamp(), "workload": wf.model_dump(mode="json"), "keys": list(KEYS), "points": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sensitivity.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
