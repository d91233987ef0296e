"""Benchmark: dsagent's digest beside ``find | xargs -P<cpus> xxh128sum``, interleaved, medians.

Uses the ImageNet-like dataset of ``bundle.py`` (same generator, same
``--dir`` layout, so ``bundle.py --keep`` data is reused) and runs, ``--runs`` times in
turn on a warm page cache: ``build_manifest`` in a fresh interpreter (timed inside it, so
interpreter start-up does not count), then the C pipeline. Prints each side's median wall
time, throughput, files/s and CPU time (user + sys of everything it ran, interpreter
start-up included for dsagent), and the ratio of medians (target >= 0.9x). Interleaving
and medians keep a noisy shared machine from favouring either side.

    python tools/bench/digest.py                          # 50,000 files, 9 runs
    python tools/bench/digest.py --files 3000 --runs 5    # a quick look
    python tools/bench/digest.py --smoke                  # seconds: checks that it runs (the test suite does)

It installs nothing: without ``xxh128sum`` (Debian's ``xxhash``) it leaves out the C column.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bundle import generate  # noqa: E402

_OURS = """
import sys, time
sys.path.insert(0, sys.argv[1])
from dsagent.format.digester import build_manifest
start = time.perf_counter()
manifest = build_manifest(sys.argv[2], name="bench")
print(time.perf_counter() - start, manifest.file_count, manifest.total_bytes)
"""


def q(path: object) -> str:
    """``path`` as one shell word (a work directory may hold spaces)."""
    return shlex.quote(str(path))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--median-kb", type=float, default=110)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", "--workdir", dest="dir", type=Path, default=ROOT / ".bench" / "bundle")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 200 small files, 3 runs")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.classes, args.median_kb, args.runs = 200, 10, 16, 3
    baseline = shutil.which("xxh128sum") is not None
    cpus = os.cpu_count() or 1
    src = args.dir / "src"
    print(f"generating (or reusing) {args.files} files under {src} ...", flush=True)
    generate(src, args.files, min(args.classes, args.files), args.median_kb, args.seed)
    subprocess.run(["bash", "-c", f"find {q(src)} -name '*.JPEG' -print0 | xargs -0 cat > /dev/null"], check=True)
    c_pipeline = (
        f"cd {q(src)} && find . -name '*.JPEG' -print0 | xargs -0 -n 500 -P {cpus} xxh128sum 2>/dev/null > /dev/null"
    )
    walls: dict[str, list[float]] = {"dsagent": [], "xxh128sum": []}
    cpu: dict[str, list[float]] = {"dsagent": [], "xxh128sum": []}
    files = total = 0
    for _ in range(args.runs):
        before = _children_cpu()
        out = subprocess.run(
            [sys.executable, "-c", _OURS, str(ROOT), str(src)], check=True, capture_output=True, text=True
        ).stdout.split()
        cpu["dsagent"].append(_children_cpu() - before)
        walls["dsagent"].append(float(out[0]))
        files, total = int(out[1]), int(out[2])
        if not baseline:
            continue
        before, start = _children_cpu(), time.perf_counter()
        subprocess.run(["bash", "-o", "pipefail", "-c", c_pipeline], check=True)
        walls["xxh128sum"].append(time.perf_counter() - start)
        cpu["xxh128sum"].append(_children_cpu() - before)
    print(f"dataset: {files} files, {total / 1e6:.1f} MB, {cpus} CPUs, {args.runs} interleaved runs\n")
    for who, label in (("dsagent", "dsagent build_manifest"), ("xxh128sum", f"find | xargs -P{cpus} xxh128sum")):
        if not walls[who]:
            print(f"  {label:<34} skipped: xxh128sum (apt package xxhash) not installed")
            continue
        wall = statistics.median(walls[who])
        print(
            f"  {label:<34} {wall:7.3f} s {total / wall / 1e6:9.1f} MB/s {files / wall:9.0f} files/s"
            f"   CPU {statistics.median(cpu[who]) / files * 1e6:5.1f} us/file"
            f"   runs {' '.join(f'{w:.2f}' for w in walls[who])}"
        )
    if walls["xxh128sum"]:
        ratio = statistics.median(walls["xxh128sum"]) / statistics.median(walls["dsagent"])
        print(f"  {'ratio of medians (dsagent / C)':<34} {ratio:7.2f}x")
    else:
        print(f"  {'ratio of medians (dsagent / C)':<34}     n/a")


if __name__ == "__main__":
    main()
