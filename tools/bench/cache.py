"""Benchmark: caching an ImageNet-like dataset onto this node, three ways, in one run.

    python tools/bench/cache.py                      # 50,000 files, 1 ms added per request (the published run)
    python tools/bench/cache.py --latency-ms 0       # the same server without added latency
    python tools/bench/cache.py --files 3000         # a quick look
    python tools/bench/cache.py --smoke              # seconds: checks that it still runs

The source is a real HTTP server on 127.0.0.1, in its own process, serving the generated
dataset and its bundles with byte ranges, and sleeping ``--latency-ms`` before answering
each request (a remote's round trip). The agent reads it through fsspec's HTTP filesystem
and checks it as it checks any remote URL: the benchmark needs no exception in the agent.
(An fsspec filesystem wrapping the local disk would not do: the agent rightly refuses a
local path outside its allowed directories.)

Ways, all from the same source into the same disk:
1. baseline: a per-file copy as a user would do it without dsplatform (one file after the
   other, like ``cp -r`` or a loop of ``aws s3 cp``);
2. dsagent without bundles: digest the source, then per-file copies with hashing, in
   parallel (the agent's CacheService, as ``dsagent serve`` runs it);
3. dsagent with bundles: the dataset packed beforehand (packing is timed and printed, but
   done once per dataset version, not per node), then parallel verified unpacking;
4. the C tools on the same bundles (``c``): ``curl | zstd -dc | tar -x`` per bundle, one
   per core, then ``sync -f``, verifying nothing: what this disk allows for these files;
5. ``dsctl cache`` as an init-container runs it (``dsctl``): a ``dsagent serve`` process is
   started on a fresh root first (not timed), then ``dsctl cache imagenet=SOURCE --bundles
   STORE`` is timed as a process from its start until it returns with the dataset ready.
It also measures this disk's sequential write bandwidth (large writes + fsync) and prints
wall times, speedups against the baseline and the bundle paths' share of the bandwidth.
``--repeat N`` runs ways 4 and 3 N times, interleaved, each against the best bandwidth
measured so far. No way's output is deleted before the end: ext4 avoids reusing the
inodes of files deleted in the last minutes (``recently_deleted``) by scanning past them,
which made every create slow right after the previous way's ``rmtree`` (~20% of the CPU
samples of a bundle run in ``perf``).
Each bundle run also prints what it used: CPU time (this process's threads and the C tools'
processes; the HTTP server's process is left out of both) as a share of all cores over its
wall time, and the disk's write requests, bytes and busy time from ``/proc/diskstats``
(where the work directory is on a block device): whether the disk or the CPU decided.
Targets: bundles >= 8x the baseline and >= 90% of the sequential bandwidth.

The test suite runs ``--smoke`` (tests/tools/test_bench_smoke.py). Data goes under
``.bench/cache`` (or ``--workdir``) and is removed unless ``--keep``.
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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fsspec

from dsagent.cache.service import CacheService, DatasetRequest
from dsagent.cache.settings import Settings
from dsagent.format.bundles.bundle import pack
from dsplatform.units import format_size

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: tools.support is the repository's

from tools.support.harness import LOOPBACK  # noqa: E402

# --------------------------------------------------------------------------- sources


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Files and directory listings of one directory, with byte ranges (fsspec's HTTP
    filesystem reads by range) and ``latency`` seconds added to every request."""

    protocol_version = "HTTP/1.1"
    latency = 0.0
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm
    # and the client's delayed ACK add ~40 ms to every keep-alive reply (real servers set it).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_HEAD(self) -> None:
        time.sleep(self.latency)
        super().do_HEAD()

    def do_GET(self) -> None:
        time.sleep(self.latency)
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


def serve(directory: Path, latency: float) -> None:
    """Run the server in this process until it is terminated: print its URL, then serve."""
    _RangeHandler.latency = latency
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _RangeHandler(*a, directory=str(directory)))
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def start_server(directory: Path, latency: float) -> tuple[str, subprocess.Popen[str]]:
    """A real HTTP server on 127.0.0.1 in its own process (it must not share the agent's
    interpreter, as a remote would not), and its base URL."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(directory), "--latency-ms", str(latency * 1000)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    base = process.stdout.readline().strip()
    if not base.startswith("http://127.0.0.1:"):
        process.kill()
        raise SystemExit(f"the HTTP server did not start (exit {process.wait()})")
    return base, process


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


async def agent_cache(
    root: Path, dataset: DatasetRequest, workers: int, local_sources: tuple[Path, ...] = ()
) -> float | str:
    settings = Settings(
        root=root, fetch_workers=workers, sweep_interval=3600, local_sources=local_sources, egress_allow=LOOPBACK
    )
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


def dsctl_cache(root: Path, source: str, store: str, workers: int, task: str) -> float | str:
    """What an init-container costs: ``dsctl cache NAME=SOURCE --bundles STORE`` as a process,
    timed from its start until it returns with the dataset ready, against a ``dsagent
    serve`` process already running (started, on its own root, before the clock starts)."""
    from dsagent.api.client import AgentClient

    sock = root.parent / f"{root.name}.sock"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as an install has them
    env.update(DSAGENT_SWEEP_INTERVAL="3600", DSAGENT_FETCH_WORKERS=str(workers))
    env["DSAGENT_EGRESS_ALLOW"] = ",".join(LOOPBACK)  # the benchmark's store is on loopback
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    log = root.parent / f"{root.name}.log"
    with open(log, "ab") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "dsagent", "serve", "--root", str(root), "--socket", str(sock)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if agent.poll() is not None or time.monotonic() > deadline:
                return f"failed: the agent did not start ({log})"
            try:
                with AgentClient(socket_path=sock, timeout=5) as client:
                    if client.health():
                        break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.05)
        script = Path(sys.executable).parent / "dsctl"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "dsagent.cli"]
        command += ["cache", f"imagenet={source}", "--bundles", store, "--task", task, "--socket", str(sock)]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            return f"failed: dsctl cache exited {done.returncode}: {done.stderr.strip()[-300:]}"
        return elapsed
    finally:
        agent.terminate()
        agent.wait(30)


def c_tools_copy(base: str, store: Path, dest: Path) -> float | str:
    """The bundles through the C tools, as fast as a shell can do it: ``curl | zstd -dc |
    tar -x`` per bundle, one per core at a time, then ``sync -f`` (dsagent's result is
    durable too). Nothing is verified. What this disk allows for these files, measured
    beside dsagent (its sequential write bandwidth alone flatters a many-files write)."""
    if not all(shutil.which(tool) for tool in ("curl", "zstd", "tar", "xargs")):
        return "skipped: needs curl, zstd, tar"
    names = sorted(path.name for path in (store / "bundles").iterdir())
    # paths and names go in as arguments and variables, never into the script's text: a work
    # directory with a space (or any shell character) is one argument
    script = (
        f'printf "%s\\n" "$@" | xargs -P {os.cpu_count() or 1} -I{{}} sh -c '
        """'mkdir -p "$0/$1" && curl -sf "$2/store/bundles/$1" | zstd -dc | tar -x -C "$0/$1"'"""
        ' "$DEST" {} "$BASE" && sync -f "$DEST"'
    )
    dest.mkdir(parents=True)
    started = time.perf_counter()
    env = {**os.environ, "DEST": str(dest), "BASE": base}
    subprocess.run(["bash", "-o", "pipefail", "-c", script, "bash", *names], check=True, env=env)
    return time.perf_counter() - started


def disk_of(directory: Path) -> str | None:
    """The ``/proc/diskstats`` name of the block device holding ``directory`` (None: no device, e.g. tmpfs)."""
    st = os.stat(directory)
    link = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    return link.resolve().name if link.exists() else None


def disk_counters(device: str | None) -> tuple[int, int, int] | None:
    """``(write requests completed, bytes written, ms the device was busy)`` so far."""
    if device is None:
        return None
    with open("/proc/diskstats") as fh:
        for line in fh:
            fields = line.split()
            if fields[2] == device:
                return int(fields[7]), int(fields[9]) * 512, int(fields[12])
    return None


def cpu_seconds() -> float:
    """CPU time of this process's threads and of its children that have ended (the C tools)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def usage(seconds: float, cpu: float, before: tuple[int, int, int] | None, after: tuple[int, int, int] | None) -> str:
    """What one run used: CPU as a share of all cores, and the disk's writes and busy time."""
    text = f"CPU {cpu:.1f} s = {cpu / seconds / (os.cpu_count() or 1):.0%} of {os.cpu_count()} cores"
    if before is not None and after is not None:
        writes, written, busy = (a - b for a, b in zip(after, before, strict=True))
        text += (
            f", {writes:,} disk writes of {written / max(writes, 1) / 1e3:.0f} kB on average,"
            f" disk busy {busy / 1000 / seconds:.0%}"
        )
    return text


def timed(fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--mean-kb", type=float, default=110.0)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument(
        "--latency-ms", type=float, default=1.0, help="latency the HTTP source adds to every request (0: none)"
    )
    parser.add_argument("--workers", type=int, default=8, help="dsagent fetch workers")
    parser.add_argument("--max-files", type=int, default=50_000, help="files per bundle")
    parser.add_argument("--max-bytes", default="800MB", help="bytes per bundle")
    parser.add_argument("--workdir", type=Path, default=Path(".bench/cache"))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--ways",
        default="baseline,files,c,bundles,dsctl",
        help="which ways to run, comma-separated (baseline, files, c, bundles, dsctl)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of the bundle way (each against a fresh bandwidth)")
    parser.add_argument(
        "--drop-caches", action="store_true", help="drop the page cache before each way (root; only on a quiet machine)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a few seconds: 200 small files, to check that the benchmark runs"
    )
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the server process started by start_server
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.latency_ms / 1000)
        return
    if args.smoke:
        args.files, args.mean_kb, args.classes = 200, 16.0, 10

    from dsplatform.units import parse_size

    work = args.workdir.absolute()
    shutil.rmtree(work, ignore_errors=True)
    (work / "www").mkdir(parents=True)
    server = None
    try:
        print(f"generating {args.files:,} files (~{args.mean_kb:g} kB, {args.classes} classes) ...", flush=True)
        total = generate(work / "www" / "imagenet", args.files, args.mean_kb, args.classes)
        t_pack = timed(
            lambda: pack(
                work / "www" / "imagenet",
                work / "www" / "store",
                name="imagenet",
                max_files=args.max_files,
                max_bytes=parse_size(args.max_bytes),
            )
        )
        base, server = start_server(work / "www", args.latency_ms / 1000)
        what = f"a real HTTP server on {base}, {args.latency_ms:g} ms added per request"
        source, store = f"{base}/imagenet", f"{base}/store"
        bandwidth = disk_write_bandwidth(work, max(total, (16 if args.smoke else 256) << 20))

        ways = set(args.ways.split(","))
        t_base: float = math.nan
        t_files: float | str = "not run"
        if "baseline" in ways:
            if args.drop_caches:
                drop_caches_hint()
            t_base = timed(baseline_copy, source, work / "baseline")
        if "files" in ways:
            if args.drop_caches:
                drop_caches_hint()
            t_files = asyncio.run(agent_cache(work / "agent-files", DatasetRequest("imagenet", source), args.workers))
        t_bundles: float | str = "not run"
        shares: list[str] = []

        def of_bandwidth(seconds: float) -> str:
            """Writing ``total`` bytes in ``seconds`` as a share of the disk's best bandwidth so far."""
            return f"{total / seconds / bandwidth:.0%}"

        t_c: float | str = "not run"
        t_dsctl: float | str = "not run"
        device = disk_of(work)
        for repeat in range(args.repeat if ways & {"bundles", "c", "dsctl"} else 0):
            c_run: float | str = "not run"
            c_used = ""
            if "c" in ways:
                if args.drop_caches:
                    drop_caches_hint()
                cpu, disk = cpu_seconds(), disk_counters(device)
                c_run = c_tools_copy(base, work / "www" / "store", work / f"c-tools-{repeat}")
                if isinstance(c_run, float):
                    c_used = usage(c_run, cpu_seconds() - cpu, disk, disk_counters(device))
                t_c = c_run if isinstance(c_run, str) or isinstance(t_c, str) else min(t_c, c_run)
            if "dsctl" in ways:
                if args.drop_caches:
                    drop_caches_hint()
                run_dsctl = dsctl_cache(work / f"agent-dsctl-{repeat}", source, store, args.workers, f"bench-{repeat}")
                fresh = isinstance(run_dsctl, str) or isinstance(t_dsctl, str)
                t_dsctl = run_dsctl if fresh else min(t_dsctl, run_dsctl)  # type: ignore[type-var]
            if "bundles" not in ways:
                continue
            if args.drop_caches:
                drop_caches_hint()
            cpu, disk = cpu_seconds(), disk_counters(device)
            run = asyncio.run(
                agent_cache(work / f"agent-bundles-{repeat}", DatasetRequest("imagenet", source, store), args.workers)
            )
            if isinstance(run, float):
                used = usage(run, cpu_seconds() - cpu, disk, disk_counters(device))
                c_share = (
                    f"; C tools {c_run:.2f} s = {of_bandwidth(c_run)} ({c_used})" if isinstance(c_run, float) else ""
                )
                shares.append(
                    f"dsagent {run:.2f} s = {of_bandwidth(run)} of {bandwidth / 1e6:.0f} MB/s ({used}){c_share}"
                )
                bandwidth = max(bandwidth, disk_write_bandwidth(work, max(total, 256 << 20)))  # the best seen
                t_bundles = run if isinstance(t_bundles, str) else min(t_bundles, run)
            elif isinstance(t_bundles, str):
                t_bundles = run

        mbps = lambda seconds: f"{total / seconds / 1e6:8.1f} MB/s"  # noqa: E731

        def line(label: str, seconds: float | str, *, share: bool = False) -> str:
            if isinstance(seconds, str):
                return f"{label:<28} {seconds}"
            extra = f"  ({of_bandwidth(seconds)} of the disk's sequential write bandwidth)" if share else ""
            return f"{label:<28} {seconds:8.2f} s  {mbps(seconds)}  {t_base / seconds:.2f}x{extra}"

        print(f"\ndataset: {args.files:,} files, {format_size(total)}; source: {what}; {os.cpu_count()} CPUs")
        print(f"disk sequential write: {bandwidth / 1e6:.0f} MB/s")
        print(f"pack (once per version):     {t_pack:8.2f} s  {mbps(t_pack)}")
        print(f"baseline per-file copy:      {t_base:8.2f} s  {mbps(t_base)}  1.00x")
        print(line("dsagent without bundles:", t_files))
        print(line("C tools (curl|zstd|tar):", t_c, share=True))
        print(line("dsagent with bundles:", t_bundles, share=True))
        print(line("dsctl cache to ready:", t_dsctl, share=True))
        if shares:
            print("bundle runs (each against the best disk bandwidth measured before it):")
            for share in shares:
                print(f"  {share}")
        print("targets: bundles >= 8x the baseline and >= 90% of the disk's bandwidth")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
