"""Benchmark: the peak memory of an agent serving its stripe share to peers.

    python tools/bench/stripe_serve.py              # 2,000 files of ~256 kB (~512 MB), 4 streams, 3 rounds
    python tools/bench/stripe_serve.py --smoke      # seconds: checks that it still runs

A real ``dsagent serve`` process (unix socket and TCP on 127.0.0.1) holds the whole of a
packed dataset as its share of a one-member stripe group (``PUT /v1/stripes``, from a local
bundle store). Its peak resident memory (``VmHWM``) is read before serving and again after
``--streams`` concurrent peer downloads (``GET /v1/peer/bundles``) of every bundle,
``--rounds`` times over. Printed: the bytes served, the peak before and after, the growth,
and the largest bundle. A bundle is re-packed as a stream, so the growth should stay near
``streams x`` the stream's buffers, not near the bytes served or the bundle size.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT))

from dsagent.format.bundles.bundle import pack  # noqa: E402
from tools.support.harness import LOOPBACK, held_port  # noqa: E402

TOKEN = "bench-peer-token-0123456789abcdef"
ADMIN = "bench-admin-token-0123456789abcdef"


def _hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--kb", type=int, default=256)
    parser.add_argument("--max-files", type=int, default=500)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", "--workdir", dest="dir", type=Path, default=ROOT / ".bench" / "stripe_serve")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.kb, args.max_files, args.rounds = 120, 16, 30, 1
    work = args.dir
    shutil.rmtree(work / "agent", ignore_errors=True)
    rng = random.Random(1)
    src = work / "src"
    if not src.exists() or len(list(src.rglob("*.bin"))) != args.files:
        shutil.rmtree(src, ignore_errors=True)
        for i in range(args.files):
            path = src / f"c{i % 10}" / f"f{i:06d}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(args.kb * 1000))
    shutil.rmtree(work / "store", ignore_errors=True)
    manifest = pack(src, work / "store", name="bench", max_files=args.max_files)
    hold = contextlib.ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the agent listens on it
    root = work / "agent"
    sock = work / "agent.sock"
    env = {**os.environ, "DSAGENT_EGRESS_ALLOW": ",".join(LOOPBACK), "DSAGENT_ADMIN_TOKEN": ADMIN,
           "DSAGENT_PEER_TOKEN": TOKEN, "DSAGENT_NODE_NAME": "n0", "DSAGENT_SWEEP_INTERVAL": "3600"}  # fmt: skip
    log = open(work / "agent.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsagent", "serve", "--root", str(root), "--socket", str(sock),
         "--listen", f"127.0.0.1:{port}", "--local-source", str(work / "store")],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(timeout=120) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"the agent did not start:\n{(work / 'agent.log').read_text()[-2000:]}")
                time.sleep(0.1)
            hold.close()
            answer = client.put(f"{base}/v1/stripes/bench", headers=admin,
                                json={"store": str(work / "store"), "members": ["n0"]})  # fmt: skip
            answer.raise_for_status()
            started = time.monotonic()
            while not client.get(f"{base}/v1/stripes/bench/{manifest.digest}").json()["complete"]:
                time.sleep(0.1)
            filled = time.monotonic() - started
        before = _hwm(proc.pid)
        digests = [b.digest for b in manifest.bundles] * args.rounds

        def fetch(digest: str) -> int:
            got = 0
            with httpx.Client(timeout=120) as peer:
                with peer.stream("GET", f"{base}/v1/peer/bundles/{digest}",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as response:  # fmt: skip
                    response.raise_for_status()
                    for chunk in response.iter_raw():
                        got += len(chunk)
            return got

        started = time.monotonic()
        with ThreadPoolExecutor(args.streams) as pool:
            served = sum(pool.map(fetch, digests))
        seconds = time.monotonic() - started
        after = _hwm(proc.pid)
    finally:
        hold.close()
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    load = os.getloadavg()
    biggest = max(b.compressed_size for b in manifest.bundles)
    print(f"{args.files} files, {manifest.total_bytes / 1e6:.0f} MB in {len(manifest.bundles)} bundles"
          f" (largest {biggest / 1e6:.0f} MB); share filled in {filled:.1f} s;"
          f" load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    rate = served / seconds / 1e6
    print(f"served {served / 1e6:.0f} MB over {args.streams} streams in {seconds:.1f} s ({rate:.0f} MB/s)")
    print(f"peak RSS before serving {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB:"
          f" grew {(after - before) / 2**20:.1f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
