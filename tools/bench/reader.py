"""Benchmark: one reader epoch (``dsplatform.data``) beside plain ``open()`` of the same files.

The dataset is ``bundle.py``'s ImageNet-like generator, packed into bundles and unpacked as
a cached local version (``dsagent.format.bundles.extract.unpack``, what the agent's ready directory
holds). Its stripe layout has one member, this node, so every bundle is local. Then, in
turn, ``--runs`` times on a warm page cache:

- **plain**: a loop that opens and reads every file with ``open()``, in the order the
  reader yields them (the same files in the same order: only the reader's own work differs);
- **reader**: one epoch of ``StripedDataset`` for rank 0 of 1, consuming each sample's bytes.

Prints each side's median wall time and throughput, and the ratio of medians (goal: the
reader within 10% of plain, ratio <= 1.10). Interleaving and medians keep a noisy shared
machine from favouring either side.

    python tools/bench/reader.py                   # 20,000 files of ~110 kB, 7 runs
    python tools/bench/reader.py --smoke           # seconds: checks that it runs (the test suite does)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle import generate  # noqa: E402

from dsagent.format.bundles.bundle import pack  # noqa: E402
from dsagent.format.bundles.extract import unpack  # noqa: E402
from dsplatform.data import StripedDataset  # noqa: E402
from dsplatform.stripe import StripeLayout  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--median-kb", type=float, default=110)
    parser.add_argument("--max-files", type=int, default=2_000, help="files per bundle (the product: 50,000)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--dir", "--workdir", dest="dir", type=Path, default=ROOT / ".bench" / "reader")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 300 small files, 3 runs")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.classes, args.median_kb, args.max_files, args.runs = 300, 10, 20, 50, 3

    source = args.dir / "src"
    generate(source, args.files, args.classes, args.median_kb, 1)
    store = args.dir / "store"
    version = args.dir / "version"
    stamp = version / ".bench-complete"
    wanted = f"{args.files} {args.classes} {args.median_kb} {args.max_files}"
    if not stamp.exists() or stamp.read_text() != wanted:
        import shutil

        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(version, ignore_errors=True)
        manifest = pack(source, store, name="bench", max_files=args.max_files)
        unpack(store, name="bench", dest=version, manifest=manifest)
        stamp.write_text(wanted)
    else:
        from dsagent.format.manifest import read_manifest

        manifest = read_manifest(str(store), "bench")
    total = manifest.total_bytes
    node = "bench-node"
    layout = StripeLayout.create(
        "bench",
        manifest.digest,
        [node],
        [(b.digest, b.first, b.count, b.size) for b in manifest.bundles],
        manifest.entries.paths,
        [e.size for e in manifest.entries],
    )
    reader = StripedDataset(version, layout=layout, node=node, whole=True, seed=3)
    order = [sample.path for sample in reader]  # the reader's order, for the plain loop; warms the cache

    def plain() -> int:
        got = 0
        for path in order:
            with open(os.path.join(version, path), "rb") as f:
                got += len(f.read())
        return got

    def ours() -> int:
        got = 0
        for sample in reader:
            got += len(sample.data)
        return got

    times: dict[str, list[float]] = {"plain": [], "reader": []}
    for _ in range(args.runs):
        for label, run in (("plain", plain), ("reader", ours)):
            start = time.perf_counter()
            got = run()
            times[label].append(time.perf_counter() - start)
            assert got == total, (label, got, total)

    load = os.getloadavg()
    print(
        f"{args.files} files, {total / 1e6:.1f} MB, {len(manifest.bundles)} bundles, {args.runs} runs interleaved;"
        f" load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"{'side':<8} {'median s':>9} {'MB/s':>8} {'files/s':>9}")
    medians = {}
    for label in ("plain", "reader"):
        m = statistics.median(times[label])
        medians[label] = m
        print(f"{label:<8} {m:>9.3f} {total / m / 1e6:>8.0f} {args.files / m:>9.0f}")
    ratios = [r / p for p, r in zip(times["plain"], times["reader"])]
    print(
        f"ratio of medians (reader / plain open) = {medians['reader'] / medians['plain']:.3f}"
        f" (pairwise median {statistics.median(ratios):.3f}; goal <= 1.10)"
    )


if __name__ == "__main__":
    main()
