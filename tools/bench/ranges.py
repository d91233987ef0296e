"""Benchmark: a dataset of one bundle fetched from the store over one link, and as byte
ranges over several (DSAGENT_FETCH_LINKS, docs/design.md#links).

    python tools/bench/ranges.py                  # one bundle of 96 MB, 3 links of 16 MB/s
    python tools/bench/ranges.py --links 4 --rate 32MB --mb 256
    python tools/bench/ranges.py --smoke          # seconds: checks that it still runs

The store is a real HTTP server with ``Range`` support in its own process
(``tools/support/ranged_http.py``) on 127.0.0.1; loopback addresses 127.0.0.2, 127.0.0.3,
... stand for the node's NICs. Loopback has no per-NIC bandwidth, so the server caps every
response at ``--rate`` bytes/s: one connection is as fast as a NIC, or as a store's
per-connection limit. Each round fetches the bundle into a fresh staging directory twice,
interleaved: over the default route (one stream) and over ``--links`` bound links (one
byte range each), through the agent's own fetch (``dsagent.cache.fetch.fetch_bundles``:
every file unpacked and verified, then made durable).

Printed: per run, the time to a verified copy, the throughput and what each link carried;
the median ratio (several links / one link, ideally ``--links``) and the load average.
Data goes under ``.bench/ranges`` (or ``--workdir``) and is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dsagent.cache.fetch import Source, fetch_bundles, finish
from dsagent.cache.fetchlinks import LinkSet
from dsagent.cache.progress import FetchProgress
from dsagent.format.bundles.bundle import pack, verify_tree
from dsagent.format.manifest import Manifest
from dsplatform.units import format_size, parse_size

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: tools.support is the repository's

from tools.support.ranged_http import RangedServerProcess  # noqa: E402


def fetch(url: str, manifest: Manifest, staging: Path, links: LinkSet | None) -> float:
    """Seconds to a verified, durable copy of the dataset in ``staging``."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    progress = FetchProgress(manifest.total_bytes, manifest.file_count)

    async def record(bundle: Any) -> None:
        pass

    async def run() -> None:
        with ThreadPoolExecutor(4) as pool:
            await fetch_bundles(
                Source(f"{url}/src", f"{url}/store"), manifest, staging, done=set(), on_bundle_done=record,
                progress=progress, executor=pool, workers=4, links=links,
            )  # fmt: skip

    started = time.perf_counter()
    asyncio.run(run())
    finish(staging, manifest)
    seconds = time.perf_counter() - started
    verify_tree(staging, manifest)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=96, help="the dataset's size (incompressible files of 1 MB)")
    parser.add_argument("--links", type=int, default=3, help="bound links (127.0.0.2, ...)")
    parser.add_argument("--rate", default="16MB", help="bytes/s per connection (the server's cap)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved pairs of runs (one link, several)")
    parser.add_argument("--workdir", type=Path, default=Path(".bench/ranges"))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 6 MB, 1 round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.mb, args.rate, args.rounds = 6, "8MB", 1
    if not sys.platform.startswith("linux"):
        raise SystemExit("needs Linux: 127.0.0.2 and up route to lo there only")
    rate = parse_size(args.rate)
    addresses = [f"127.0.0.{2 + i}" for i in range(args.links)]

    work = args.workdir.absolute()
    shutil.rmtree(work, ignore_errors=True)
    (work / "www" / "src").mkdir(parents=True)
    server = None
    try:
        for i in range(args.mb):
            (work / "www" / "src" / f"part{i:04d}.bin").write_bytes(os.urandom(1 << 20))
        manifest = pack(work / "www" / "src", work / "www" / "store", name="one")
        (bundle,) = manifest.bundles
        minimum = bundle.compressed_size // args.links  # every link a range
        server = RangedServerProcess(work / "www", rate=rate)
        url = server.url
        runs: list[tuple[str, float, LinkSet | None]] = []
        for _ in range(args.rounds):  # interleaved: one link, several, one link, ...
            runs.append(("one link", fetch(url, manifest, work / "staging", None), None))
            links = LinkSet(addresses, range_min=minimum)
            runs.append((f"{args.links} links", fetch(url, manifest, work / "staging", links), links))
        load = os.getloadavg()

        print(f"\ndataset: {manifest.file_count} files, 1 bundle of {format_size(bundle.compressed_size)}; "
              f"each connection {format_size(rate)}/s (the server's cap); {os.cpu_count()} CPUs")  # fmt: skip
        print(f"{'run':<10} {'ready':>9} {'total':>12}  per link (ranges)")
        for label, seconds, links in runs:
            carried = links.range_bytes if links is not None else {"127.0.0.1": bundle.compressed_size}
            per_link = "  ".join(f"{a} {format_size(n)}" for a, n in carried.items())
            total = format_size(int(bundle.compressed_size / seconds))
            print(f"{label:<10} {seconds:>7.2f} s {total + '/s':>12}  {per_link}")
        one = [s for label, s, _ in runs if label == "one link"]
        many = [s for label, s, _ in runs if label != "one link"]
        ratio = statistics.median(one) / statistics.median(many)
        ranged = [links for _, _, links in runs if links is not None]
        print(f"throughput ratio ({args.links} links / one link, medians): {ratio:.2f}x (ideal {args.links}x)")
        print(f"every link carried a range: {all(all(n == 1 for n in s.ranges.values()) for s in ranged)}")
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        if server is not None:
            server.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
