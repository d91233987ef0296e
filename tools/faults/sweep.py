"""The full fault-injection sweep of a fetch: a multi-bundle one, and per-file copies.

For every filesystem operation and catalog commit that a fetch of a multi-bundle tar+zstd
dataset (15 files, 9 bundles, an empty directory) reaches (counted in a dry run), and for
each of ENOSPC, EIO and EDQUOT, failed once and failed from there on (a full disk stays
full): an in-process agent serves the task with that fault, then the same request with
the fault gone; then the same with ``kill -9`` at each point (a forked child of the
agent's service; ``--serve-points`` of them also against a real ``dsagent serve``), a
restart and the same request. The loops are the ones that run in production: where the
native extension is built, the C unpack loop's creates and writes are injection points too
(its I/O hook; the output says how many). After each it checks what ``tools/support/faults.py`` describes:
failed with a clear code or ready with a copy that verifies, never anything in between
reported ready, no staging, reservation, record or trash left. The suite runs a sample
(tests/dsagent/cache/test_fault_injection.py).

``--per-file`` sweeps a per-file copy (no bundle store) from a local directory, a real
HTTP server and a real S3 server (moto) on 127.0.0.1 instead: every operation on the
cache disk as above (a disk that fills mid-write: ENOSPC from that write on, with the
space check up front passed), every read of a source file failing (EIO, ECONNRESET),
``kill -9`` at every operation and read, and the source rewritten at every read. A ready
copy must hold every file as exactly one version of its source file; a copy the source
changed under must fail as ``integrity``. The suite runs a sample
(tests/dsagent/cache/test_fault_injection_per_file.py).

    .venv/bin/python tools/faults/sweep.py            # every point: ~10 min on a loaded 2-core VM
    .venv/bin/python tools/faults/sweep.py --smoke    # every 10th point, ENOSPC only, 10 kill points
    .venv/bin/python tools/faults/sweep.py --json     # one JSON object instead of the table
    .venv/bin/python tools/faults/sweep.py --per-file # the per-file copies from the three sources

Exit status 1 when any point broke an invariant (each is printed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.support.faults import (  # noqa: E402
    ERRNOS,
    KINDS,
    READ_ERRNOS,
    Dataset,
    PerFileSource,
    run_forked_kill_point,
    run_kill_point,
    run_point,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a sample: every 10th point, ENOSPC, 10 kill points")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--serve-points",
        type=int,
        default=None,
        help="kill -9 points also run against a real dsagent serve process (~15 s each; default 3, 0 with --smoke)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where to work (default: a temporary directory)")
    parser.add_argument(
        "--per-file", action="store_true", help="sweep per-file copies from a directory, HTTP and S3 instead"
    )
    parser.add_argument(
        "--sources", default="local,http,s3", help="with --per-file: which sources (default local,http,s3)"
    )
    args = parser.parse_args()
    logging.getLogger("dsagent").setLevel(logging.CRITICAL)  # the agent's warnings are expected here
    base = args.workdir or Path(tempfile.mkdtemp(prefix="dsagent-faults-"))
    if args.per_file:
        return per_file(base, args.sources.split(","), smoke=args.smoke, as_json=args.json)
    data = Dataset.make(base / "data", files=15, per_bundle=3)
    started = time.monotonic()
    counted, injector = run_point(base / "count", data, None)
    if counted.violations:
        print("the fault-free run broke an invariant:", counted.violations)
        return 1
    from dsagent.format import native

    if native.AVAILABLE and not injector.native_ops:
        print("the native loops are on but the C unpack loop reached no injection point")
        return 1
    points = injector.count
    step = 10 if args.smoke else 1
    codes = {"ENOSPC": ERRNOS["ENOSPC"]} if args.smoke else ERRNOS
    outcomes: Counter[str] = Counter()
    broken: list[str] = []
    runs = 0
    for label, code in codes.items():
        for persist in (False, True):
            mode = "persist" if persist else "once"
            for at in range(1, points + 1, step):
                outcome, _ = run_point(base / f"{label}-{mode}-{at}", data, at, code=code, persist=persist)
                runs += 1
                outcomes[f"{label} {mode}: {outcome.first} -> retry {outcome.retry}"] += 1
                broken += [f"{label} {mode} at {at} {outcome.op}: {v}" for v in outcome.violations]
    kill_points = range(1, points + 2, max(1, points // 10) if args.smoke else 1)
    for at in kill_points:
        outcome = run_forked_kill_point(base / f"kill-{at}", data, at)
        runs += 1
        outcomes[f"kill -9: {outcome.first} -> restart {outcome.retry}"] += 1
        broken += [f"kill -9 at {at}: {v}" for v in outcome.violations]
    serve = args.serve_points if args.serve_points is not None else (0 if args.smoke else 3)
    serve_points = sorted({max(1, (points * (i + 1)) // (serve + 1)) for i in range(serve)})
    for at in serve_points:
        outcome = run_kill_point(base / f"serve-kill-{at}", data, at)
        runs += 1
        outcomes[f"kill -9 (dsagent serve): {outcome.first} -> restart {outcome.retry}"] += 1
        broken += [f"kill -9 of dsagent serve at {at}: {v}" for v in outcome.violations]
    seconds = time.monotonic() - started
    summary = {
        "bundles": len(data.manifest().bundles),
        "files": data.manifest().file_count,
        "injection_points": points,
        "operations": dict(injector.kinds),
        "native_loops": native.describe(),
        "native_operations": injector.native_ops,
        "errnos": list(codes),
        "runs": runs,
        "kill_points": len(kill_points),
        "serve_kill_points": serve_points,
        "outcomes": dict(sorted(outcomes.items())),
        "violations": broken,
        "seconds": round(seconds, 1),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"dataset: {summary['files']} files in {summary['bundles']} bundles (tar+zstd)")
        print(f"native loops: {summary['native_loops']} ({injector.native_ops} of the points in the C unpack loop)")
        print(f"injection points: {points} ({', '.join(f'{k} {v}' for k, v in sorted(injector.kinds.items()))})")
        print(
            f"runs: {runs} ({len(codes)} errnos x once/persist x {len(range(1, points + 1, step))} points"
            f" + {len(kill_points)} kill -9 points), {seconds:.0f} s"
        )
        for line, count in sorted(outcomes.items()):
            print(f"  {count:5d}  {line}")
        print(f"violations: {len(broken)}")
        for line in broken:
            print(f"  {line}")
    return 1 if broken else 0


def per_file(base: Path, kinds: list[str], *, smoke: bool, as_json: bool) -> int:
    """Every point of a per-file copy from each source in ``kinds``."""
    import os

    started = time.monotonic()
    step = 10 if smoke else 1
    codes = {"ENOSPC": ERRNOS["ENOSPC"]} if smoke else ERRNOS
    read_codes = {"EIO": READ_ERRNOS["EIO"]} if smoke else READ_ERRNOS
    s3 = None
    if "s3" in kinds:
        from tools.support.s3server import S3Server

        base.mkdir(parents=True, exist_ok=True)
        s3 = S3Server(base / "moto.log")
        os.environ.update(s3.env())
    outcomes: Counter[str] = Counter()
    broken: list[str] = []
    figures: dict[str, dict[str, int]] = {}
    runs = 0
    try:
        for kind in kinds:
            source = PerFileSource.make(kind, base / kind / "src", s3=s3)
            try:
                counted, disk = run_point(base / kind / "count", source, None)
                _, reads = run_point(base / kind / "count-reads", source, None, kinds=("read",))
                _, both = run_point(base / kind / "count-all", source, None, kinds=(*KINDS, "read"))
                if counted.violations:
                    broken += [f"{kind}: the fault-free run: {v}" for v in counted.violations]
                    continue
                figures[kind] = {
                    "disk_points": disk.count,
                    "read_points": reads.count,
                    **{f"op_{k}": n for k, n in sorted(disk.kinds.items())},
                }
                for label, code in codes.items():
                    for persist in (False, True):
                        mode = "persist" if persist else "once"
                        for at in range(1, disk.count + 1, step):
                            where = base / kind / f"{label}-{mode}-{at}"
                            outcome, _ = run_point(where, source, at, code=code, persist=persist)
                            runs += 1
                            outcomes[f"{kind} disk {label} {mode}: {outcome.first} -> retry {outcome.retry}"] += 1
                            broken += [f"{kind} {label} {mode} at {at} {outcome.op}: {v}" for v in outcome.violations]
                for label, code in read_codes.items():
                    for at in range(1, reads.count + 1, step):
                        where = base / kind / f"read-{label}-{at}"
                        outcome, _ = run_point(where, source, at, code=code, kinds=("read",))
                        runs += 1
                        outcomes[f"{kind} read {label}: {outcome.first} -> retry {outcome.retry}"] += 1
                        broken += [f"{kind} read {label} at {at} {outcome.op}: {v}" for v in outcome.violations]
                for at in range(1, reads.count + 1, step):
                    changed = PerFileSource.make(kind, base / kind / f"change-src-{at}", s3=s3)
                    try:
                        outcome, _ = run_point(base / kind / f"change-{at}", changed, at, kinds=("read",), change=True)
                    finally:
                        changed.close()
                    runs += 1
                    outcomes[f"{kind} source rewritten: {outcome.first} -> retry {outcome.retry}"] += 1
                    broken += [f"{kind} source rewritten at read {at} {outcome.op}: {v}" for v in outcome.violations]
                kill_points = range(1, both.count + 2, max(1, both.count // 10) if smoke else 1)
                for at in kill_points:
                    outcome = run_forked_kill_point(base / kind / f"kill-{at}", source, at, kinds=(*KINDS, "read"))
                    runs += 1
                    outcomes[f"{kind} kill -9: {outcome.first} -> restart {outcome.retry}"] += 1
                    broken += [f"{kind} kill -9 at {at}: {v}" for v in outcome.violations]
                figures[kind]["kill_points"] = len(kill_points)
            finally:
                source.close()
    finally:
        if s3 is not None:
            s3.close()
    seconds = time.monotonic() - started
    summary = {
        "sources": figures,
        "errnos": list(codes),
        "read_errnos": list(read_codes),
        "runs": runs,
        "outcomes": dict(sorted(outcomes.items())),
        "violations": broken,
        "seconds": round(seconds, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        for kind, numbers in figures.items():
            print(f"{kind}: {', '.join(f'{k} {v}' for k, v in numbers.items())}")
        print(f"runs: {runs}, {seconds:.0f} s, load average {summary['load_average']}")
        for line, count in sorted(outcomes.items()):
            print(f"  {count:5d}  {line}")
        print(f"violations: {len(broken)}")
        for line in broken:
            print(f"  {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
