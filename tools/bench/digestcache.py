"""Benchmark: the digest cache recording a big tree again after one of its files changed.

What a digest with the cache (``dsctl digest``, ``dsctl pack``, the agent's local sources)
does at its end: :meth:`DigestCache.store` of the tree's columns, one file's digest new.
Two sides, interleaved, in one run, on one SQLite file each in ``--workdir``:

    parts       the cache as it is: only the parts of the record whose bytes changed are
                written (one part, 65,536 files or a little more)
    whole       the same call given a snapshot without its parts' hashes, so every part is
                written again: what a record written whole costs (the baseline)

The tree is synthetic (``--files`` paths in ``--dirs`` directories, ImageNet's shape),
in the columns the native listing gives; no file is read, so the figures are the cache's
alone. Prints each side's median and best wall time and the bytes its last round wrote
(``/proc/self/io``, SQLite's journal and checkpoint included), and the ratio of medians
(whole / parts).

    python tools/bench/digestcache.py                          # 1,000,000 files, 7 rounds
    python tools/bench/digestcache.py --files 14000000 --dirs 21841 --rounds 3
    python tools/bench/digestcache.py --smoke                  # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dsagent.format.digestcache import DigestCache, Snapshot  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support.record import Record  # noqa: E402


def tree(files: int, dirs: int) -> tuple[list[str], tuple[array[int], ...], bytes]:
    """``files`` paths in ``dirs`` directories in path order, their four stat columns (size,
    mtime, inode, ctime) and digests."""
    paths = sorted(f"n{i % dirs:08d}/n{i % dirs:08d}_{i:08d}.JPEG" for i in range(files))
    columns = tuple(array("q", range(k, files + k)) for k in range(4))
    return paths, columns, os.urandom(16 * files)


def bytes_written() -> int:
    """What this process has passed to ``write`` and its kin so far (Linux ``/proc/self/io``:
    SQLite's journal and checkpoint writes too); 0 where it cannot be read."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "wchar":
                return int(value)
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--dirs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workdir", type=Path, help="where the SQLite files go (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="seconds: 200,000 files, 2 rounds")
    parser.add_argument("--json", type=Path, help="write the results here (tools/bench/support/record.py)")
    opts = parser.parse_args()
    if opts.smoke:
        opts.files, opts.dirs, opts.rounds = 200_000, 200, 2
    if opts.workdir is None:
        with tempfile.TemporaryDirectory(prefix="digestcache-bench-") as work:
            run(opts, Path(work))
    else:
        opts.workdir.mkdir(parents=True, exist_ok=True)
        run(opts, opts.workdir)


def run(opts: argparse.Namespace, work: Path) -> None:
    record = Record("digestcache", {"files": opts.files, "dirs": opts.dirs, "rounds": opts.rounds})
    paths, (sizes, mtimes, inodes, ctimes), digests = tree(opts.files, opts.dirs)
    caches = {side: DigestCache(work / f"{side}.sqlite", racy_window_ns=0) for side in ("parts", "whole")}
    for cache in caches.values():
        cache.store(cache.snapshot("/data"), paths, sizes, mtimes, inodes, ctimes, digests)
    times: dict[str, list[float]] = {side: [] for side in caches}
    written: dict[str, int] = {}
    print(f"{opts.files:,} files in {opts.dirs:,} directories, one file changed a round; load {os.getloadavg()[0]:.2f}")
    for turn in range(opts.rounds):
        changed = bytearray(digests)
        changed[16 * (turn * 7919 % opts.files)] ^= 0xFF  # one file's digest, somewhere else each round
        digests = bytes(changed)
        for side in ("parts", "whole") if turn % 2 == 0 else ("whole", "parts"):
            cache = caches[side]
            snapshot = cache.snapshot("/data")
            if side == "whole":
                snapshot = Snapshot(snapshot.root, snapshot.paths, (snapshot.sizes, snapshot.mtimes,
                                    snapshot.inodes, snapshot.ctimes), snapshot.digests)  # fmt: skip
            before = bytes_written()
            start = time.perf_counter()
            cache.store(snapshot, paths, sizes, mtimes, inodes, ctimes, digests)
            times[side].append(time.perf_counter() - start)
            written[side] = bytes_written() - before
    step = f"store after one file changed, {opts.files:,} files"
    for side, cache in caches.items():
        cache.close()
        median = statistics.median(times[side])
        record.row(step, f"{side} (median of {opts.rounds}, {written[side] / 1e6:.1f} MB written)", median)
        best, mb = min(times[side]), written[side] / 1e6
        print(f"  {side:<6} median {median:7.3f} s   best {best:7.3f} s   written {mb:7.1f} MB")
    ratio = statistics.median(times["whole"]) / statistics.median(times["parts"])
    note = f"{written['whole'] / 1e6:.1f} MB / {written['parts'] / 1e6:.1f} MB written"
    name = f"digest cache store, one file changed in {opts.files:,}: whole record / changed parts"
    record.ratio(name, ratio, None, note)
    print(f"  ratio of medians (whole / parts) {ratio:.2f}x; load {os.getloadavg()[0]:.2f}")
    record.write(opts.json)


if __name__ == "__main__":
    main()
