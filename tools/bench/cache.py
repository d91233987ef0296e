"""Benchmark: caching an ImageNet-like dataset onto this node, three ways, in one run.

    python tools/bench/cache.py                      # 50,000 files, 1 ms per open (the issue's run)
    python tools/bench/cache.py --source http        # a real HTTP server on 127.0.0.1 instead
    python tools/bench/cache.py --files 3000         # a quick look
    python tools/bench/cache.py --smoke              # seconds: checks that the benchmark still runs
    python tools/bench/cache.py --ways bundles --files 20000 --repeat 3
                                                     # only the bundle path against the disk's bandwidth

Ways, all from the same source into the same disk:
1. baseline: a per-file copy as a user would do it without dsplatform (one file after the
   other, like ``cp -r`` or a loop of ``aws s3 cp``);
2. dsagent without bundles: digest the source, then per-file copies with hashing, in
   parallel (the agent's CacheService, as ``dsagent serve`` runs it);
3. dsagent with bundles: the dataset packed beforehand (packing is timed and printed, but
   done once per dataset version, not per node), then parallel verified unpacking.
It also measures this disk's sequential write bandwidth (large writes + fsync) and prints
wall times, speedups against the baseline and the bundle path's share of the bandwidth.
Targets: bundles >= 8x the baseline (issue 3) and >= 90% of the sequential bandwidth
(issue 14). With ``--repeat N`` the bandwidth and the bundle path are measured N times,
alternating, and the best of each is used (the disk is shared on the development machine).

Not run by CI. Data goes under ``.bench/cache`` (or ``--workdir``) and is removed unless
``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import math
import os
import random
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dsagent.format.bundle import pack
from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsplatform.units import format_size

# --------------------------------------------------------------------------- sources


class SlowLocalFileSystem(LocalFileSystem):
    """``slowfile://``: the local filesystem with a fixed latency per open (network storage)."""

    protocol = ("slowfile",)
    latency = 0.001

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith("slowfile://"):
            path = path[len("slowfile://") :]
        return super()._strip_protocol(path)

    def _open(self, path: Any, mode: str = "rb", **kwargs: Any) -> Any:
        time.sleep(self.latency)
        return super()._open(path, mode, **kwargs)


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        match = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if match is None or not path.is_file():
            super().do_GET()
            return
        size = path.stat().st_size
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with open(path, "rb") as fh:
            fh.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = fh.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)


def serve_http(directory: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _RangeHandler(*a, directory=str(directory)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return f"http://{host}:{port}", server


# --------------------------------------------------------------------------- data


def generate(root: Path, files: int, mean_kb: float, classes: int, seed: int = 1) -> int:
    """Log-normal sizes around ``mean_kb`` of incompressible bytes (like JPEGs)."""
    rng = random.Random(seed)
    sigma = 0.6
    mu = math.log(mean_kb * 1000) - sigma**2 / 2
    pool = os.urandom(4 << 20)
    total = 0
    for i in range(files):
        size = max(1, min(int(rng.lognormvariate(mu, sigma)), len(pool)))
        start = rng.randrange(0, len(pool) - size + 1)
        path = root / f"n{(i % classes):08d}" / f"img_{i:07d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pool[start : start + size])
        total += size
    return total


def disk_write_bandwidth(directory: Path, nbytes: int) -> float:
    """Sequential write bandwidth in bytes/s: 8 MiB writes, then fsync."""
    block = os.urandom(8 << 20)
    path = directory / "seqwrite.bin"
    started = time.perf_counter()
    with open(path, "wb") as fh:
        written = 0
        while written < nbytes:
            fh.write(block)
            written += len(block)
        fh.flush()
        os.fsync(fh.fileno())
    elapsed = time.perf_counter() - started
    path.unlink()
    return written / elapsed


def drop_caches_hint() -> None:
    if os.geteuid() == 0 and Path("/proc/sys/vm/drop_caches").exists():
        os.system("sync")
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


# --------------------------------------------------------------------------- the three ways


def baseline_copy(url: str, dest: Path) -> None:
    """One file after the other, as ``cp -r`` or a shell loop over a network copy does."""
    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    for path in sorted(fs.find(root)):
        target = dest / path[len(root) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        with fs.open(path, "rb") as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)


async def agent_cache(root: Path, dataset: DatasetRequest, workers: int, local_sources: tuple[Path, ...] = ()) -> float | str:
    settings = Settings(root=root, fetch_workers=workers, sweep_interval=3600, local_sources=local_sources)
    service = CacheService(settings)
    await service.start()
    try:
        started = time.perf_counter()
        record = await service.submit_task("bench", [dataset], wait=24 * 3600)
        elapsed = time.perf_counter() - started
        if record.state != "ready":
            error = record.datasets[0].error or {}
            return f"failed: {error.get('message')}"
        return elapsed
    finally:
        await service.stop()


def timed(fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--mean-kb", type=float, default=110.0)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--source", choices=["latency", "http"], default="latency")
    parser.add_argument("--latency-ms", type=float, default=1.0, help="per-open latency of the latency source")
    parser.add_argument("--workers", type=int, default=8, help="dsagent fetch workers")
    parser.add_argument("--max-files", type=int, default=50_000, help="files per bundle")
    parser.add_argument("--max-bytes", default="800MB", help="bytes per bundle")
    parser.add_argument("--workdir", type=Path, default=Path(".bench/cache"))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--ways", default="baseline,files,bundles", help="comma-separated subset of baseline,files,bundles")
    parser.add_argument("--repeat", type=int, default=1, help="best of N alternating runs of the bandwidth and the bundle path")
    parser.add_argument("--smoke", action="store_true", help="a few hundred small files: checks in seconds that the benchmark runs")
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before each way (root; only on a quiet machine)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.files, args.classes, args.mean_kb = 300, 10, 20
    ways = set(args.ways.split(","))

    from dsplatform.units import parse_size

    work = args.workdir.absolute()
    shutil.rmtree(work, ignore_errors=True)
    (work / "www").mkdir(parents=True)
    fsspec.register_implementation("slowfile", SlowLocalFileSystem, clobber=True)
    SlowLocalFileSystem.latency = args.latency_ms / 1000
    try:
        print(f"generating {args.files:,} files (~{args.mean_kb:g} kB, {args.classes} classes) ...", flush=True)
        total = generate(work / "www" / "imagenet", args.files, args.mean_kb, args.classes)
        t_pack = timed(lambda: pack(work / "www" / "imagenet", work / "www" / "store", name="imagenet", max_files=args.max_files, max_bytes=parse_size(args.max_bytes)))
        server = None
        if args.source == "http":
            base, server = serve_http(work / "www")
            what = f"a real HTTP server on {base}"
        else:
            base = f"slowfile://{work / 'www'}"
            what = f"the local disk with {args.latency_ms:g} ms per open"
        source, store = f"{base}/imagenet", f"{base}/store"
        allowed = (work / "www",)  # the agent reads local sources only from directories it is given
        bandwidth = disk_write_bandwidth(work, max(total, 256 << 20))

        t_base: float | str = "skipped"
        t_files: float | str = "skipped"
        t_bundles: float | str = "skipped"
        if "baseline" in ways:
            if args.drop_caches:
                drop_caches_hint()
            t_base = timed(baseline_copy, source, work / "baseline")
            shutil.rmtree(work / "baseline")
        if "files" in ways:
            if args.drop_caches:
                drop_caches_hint()
            t_files = asyncio.run(agent_cache(work / "agent-files", DatasetRequest("imagenet", source), args.workers, allowed))
            shutil.rmtree(work / "agent-files", ignore_errors=True)
        if "bundles" in ways:
            for run in range(max(1, args.repeat)):
                if run:
                    bandwidth = max(bandwidth, disk_write_bandwidth(work, max(total, 256 << 20)))
                shutil.rmtree(work / "agent-bundles", ignore_errors=True)
                os.sync()
                if args.drop_caches:
                    drop_caches_hint()
                took = asyncio.run(agent_cache(work / "agent-bundles", DatasetRequest("imagenet", source, store), args.workers, allowed))
                t_bundles = took if isinstance(took, str) or isinstance(t_bundles, str) else min(t_bundles, took)
        if server is not None:
            server.shutdown()

        mbps = lambda seconds: f"{total / seconds / 1e6:8.1f} MB/s"  # noqa: E731

        def line(label: str, seconds: float | str, extra: str = "") -> str:
            if isinstance(seconds, str):
                return f"{label:<28} {seconds}"
            speedup = f"  {t_base / seconds:.2f}x" if isinstance(t_base, float) else ""
            return f"{label:<28} {seconds:8.2f} s  {mbps(seconds)}{speedup}{extra}"

        print(f"\ndataset: {args.files:,} files, {format_size(total)}; source: {what}; {os.cpu_count()} CPUs")
        print(f"disk sequential write: {bandwidth / 1e6:.0f} MB/s")
        print(f"pack (once per version):     {t_pack:8.2f} s  {mbps(t_pack)}")
        print(line("baseline per-file copy:", t_base))
        print(line("dsagent without bundles:", t_files))
        share = "" if isinstance(t_bundles, str) else f"  ({total / t_bundles / bandwidth:.0%} of the disk's sequential write bandwidth)"
        print(line("dsagent with bundles:", t_bundles, share))
        print("targets: bundles >= 8x the baseline and >= 90% of the disk's bandwidth")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
