"""``make demo``: the main job on its embedded defaults, in a few readable lines.

Stage 1 (datasets and bundles): generate a small image-like dataset (incompressible
"JPEGs" in class folders, one empty class), digest it, pack it into tar+zstd bundles,
change one file and pack again to show that unchanged bundles are reused, then unpack
and verify it into a cache folder.

Stage 2 (the node agent): start ``dsagent serve`` on a unix socket with a small capacity
limit, cache the packed dataset for a task (then again for a second task: an instant
hit), list the cache, release the tasks, cache a second dataset that needs the space and
watch the first one evicted (least recently used, not in use, 1.2x rule), stop the agent.

Everything lives under ``./demo-cache`` and takes a few seconds.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

from dsagent.format.bundles.bundle import unpack, verify_tree, write_bundles
from dsagent.format.digester import build_manifest
from dsagent.policy.eviction import EVICT_RATIO
from dsplatform.units import format_size

DEMO_ROOT = Path("demo-cache")
DATASET = "imagenet-mini"
FILES = 600
CLASSES = 20
MAX_BYTES = 8_000_000


def generate(root: Path, files: int = FILES, classes: int = CLASSES, seed: int = 7) -> int:
    """An ImageNet-shaped toy: log-normal sizes around 50 KB of random bytes; returns total bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        size = max(2000, int(rng.lognormvariate(10.8, 0.5)))
        path = root / "train" / f"n{i % classes:08d}" / f"img_{i:05d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        total += size
    (root / "train" / f"n{classes:08d}").mkdir(parents=True)  # a class with no images yet
    return total


def run(root: Path = DEMO_ROOT) -> list[str]:
    """Run stage 1 under ``root``; returns the lines it printed."""
    lines: list[str] = []

    def say(verb: str, text: str) -> None:
        lines.append(f"  {verb:<10} {text}")
        print(lines[-1], flush=True)

    source, store, cache = root / "source", root / "store", root / "datasets"
    for path in (source, store, cache):
        shutil.rmtree(path, ignore_errors=True)
    from dsagent.format import native

    print(f"dsplatform demo, stage 1: digest, pack, unpack and verify a dataset (native loops {native.describe()})")
    total = generate(source)
    say("generated", f"{source}: {FILES} image-like files, {format_size(total)} in {CLASSES} classes (+1 empty class)")

    start = time.monotonic()
    manifest = build_manifest(source, name=DATASET)
    say(
        "digested", f"{manifest.file_count} files in {time.monotonic() - start:.2f} s: dataset digest {manifest.digest}"
    )

    start = time.monotonic()
    packed, _ = write_bundles(manifest, source, store, max_bytes=MAX_BYTES)
    stored = sum(b.compressed_size for b in packed.bundles)
    say(
        "packed",
        f"into {len(packed.bundles)} tar+zstd bundles of at most {format_size(MAX_BYTES)} "
        f"({format_size(stored)} stored) in {time.monotonic() - start:.2f} s",
    )

    changed = source / packed.entries[len(packed.entries) // 2].path
    changed.write_bytes(random.Random(1).randbytes(changed.stat().st_size))
    repacked, reused = write_bundles(build_manifest(source, name=DATASET), source, store, max_bytes=MAX_BYTES)
    say(
        "re-packed",
        f"after changing {changed.name}: {len(repacked.bundles) - reused} bundle rewritten, {reused} reused; "
        f"new digest {repacked.digest}",
    )

    start = time.monotonic()
    target = cache / DATASET
    unpack(store, name=DATASET, dest=target)
    say(
        "unpacked",
        f"into {target}: every file checked against its xxh3-128 while written, in {time.monotonic() - start:.2f} s",
    )

    verify_tree(target, repacked)
    say("verified", f"{target} holds exactly the {repacked.file_count} files and the empty class of {DATASET}")
    return lines


AGENT_DATASET = "coco-mini"


def run_agent(root: Path = DEMO_ROOT) -> list[str]:
    """Run stage 2 under ``root`` (after :func:`run`); returns the lines it printed."""
    import sys

    from dsagent.api.client import AgentClient
    from dsagent.format.bundles.bundle import pack
    from dsagent.format.manifest import read_manifest

    lines: list[str] = []

    def say(verb: str, text: str) -> None:
        lines.append(f"  {verb:<10} {text}")
        print(lines[-1], flush=True)

    store, agent_root, sock = (root / "store").absolute(), (root / "agent").absolute(), (root / "agent.sock").absolute()
    shutil.rmtree(agent_root, ignore_errors=True)
    first = read_manifest(str(store), DATASET)
    second_source = root / "source-2"
    shutil.rmtree(second_source, ignore_errors=True)
    generate(second_source, seed=11)
    second = pack(second_source, store, name=AGENT_DATASET, max_bytes=MAX_BYTES)
    capacity = first.total_bytes + second.total_bytes  # room for one, not for one plus 1.2x the other
    print("dsplatform demo, stage 2: the node agent caches, hits, lists and evicts")
    log = open(root / "agent.log", "wb")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsagent",
            "serve",
            "--root",
            str(agent_root),
            "--socket",
            str(sock),
            "--capacity",
            str(capacity),
            "--node-name",
            "demo-node",
            "--local-source",
            str(root.absolute()),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        client = AgentClient(socket_path=sock, timeout=120)
        _wait_until_up(client, agent)
        say("started", f"dsagent on {sock} (pid {agent.pid}), capacity {format_size(capacity)}")
        spec = {"name": DATASET, "source": str((root / "source").absolute()), "bundles": str(store)}
        for task, verb in (("train-job-1", "cached"), ("train-job-2", "hit")):
            start = time.monotonic()
            record = client.submit_task(task, [spec], wait=120)
            if record["state"] != "ready":
                raise RuntimeError(f"caching failed: {record['datasets'][0]['error']}")
            entry = record["datasets"][0]
            digest = (entry["digest"] or "-")[:12]
            say(verb, f"{DATASET}@{digest} for {task} in {time.monotonic() - start:.2f} s -> {entry['path']}")
        for row in client.datasets()["datasets"]:
            say(
                "listed",
                f"{row['name']} {row['digest'][:12]} {row['state']} {format_size(row['sizeBytes'])} "
                f"{row['files']} files, in use: {row['inUse']}",
            )
        client.release_task("train-job-1")
        client.release_task("train-job-2")
        space = client.datasets()
        say(
            "released",
            f"both tasks; free {format_size(space['freeBytes'])}, "
            f"{AGENT_DATASET} needs {EVICT_RATIO} x {format_size(second.total_bytes)}",
        )
        record = client.submit_task(
            "train-job-3",
            [{"name": AGENT_DATASET, "source": str(second_source.absolute()), "bundles": str(store)}],
            wait=120,
        )
        held = [d["name"] for d in client.datasets()["datasets"]]
        evicted = int(float(_metric(client.metrics(), 'dsplatform_agent_evictions_total{reason="space"}')))
        say(
            "evicted",
            f"{evicted} dataset ({DATASET}, least recently used) to cache {AGENT_DATASET}: {record['state']}; "
            f"cache now holds {', '.join(held)}",
        )
        client.close()
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    how = "gracefully on SIGTERM" if agent.returncode in (0, -15) else f"with exit code {agent.returncode}"
    say("stopped", f"dsagent {how}; its log is {root / 'agent.log'}")
    return lines


def _wait_until_up(client: object, agent: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    from dsagent.api.client import AgentClient
    from dsagent.errors import AgentUnreachable

    assert isinstance(client, AgentClient)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError("dsagent exited at start-up; see demo-cache/agent.log")
        try:
            if client.health():
                return
        except AgentUnreachable:
            time.sleep(0.05)
    raise RuntimeError("dsagent did not start in time; see demo-cache/agent.log")


def _metric(text: str, name: str) -> str:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return line.split()[-1]
    return "0"


def main() -> None:
    import os

    from dsagent.cli.edge import native_switch

    native_switch(os.environ)  # DSAGENT_NATIVE=0: the pure-Python loops
    run()
    run_agent()


if __name__ == "__main__":
    main()
